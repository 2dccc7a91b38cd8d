//! Connection-level faults (`reset`, `truncate`) for the main HTTP server.
//!
//! hyper owns each connection, so a handler cannot close it directly. The
//! main server is therefore served through [`CtlListener`], whose sockets
//! ([`CtlStream`]) share a [`ConnCtl`] switch with the handler (reached as
//! `ConnectInfo<ConnHandle>`). Once the switch is thrown, every read, write
//! and flush of the socket fails; hyper then drops the connection quietly
//! (no panic, nothing on stderr) and the socket is closed:
//!
//! * [`ConnCtl::reset`]: at once, and with `SO_LINGER` 0, so the close is a
//!   TCP RST. The handler still returns a (dummy) response, which makes hyper
//!   write, which fails: not one response byte leaves the process.
//! * [`ConnCtl::close_after_flush`]: at hyper's next flush of the socket,
//!   which hyper only does once everything it buffered has been written. A
//!   body that yields a chunk and then throws this switch (see
//!   [`truncated_body`]) gets exactly the head and that chunk out, then a
//!   plain close (FIN) in place of the rest of the body.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

const OPEN: u8 = 0;
const CLOSE_AFTER_FLUSH: u8 = 1;
const CLOSED: u8 = 2;
const RESET: u8 = 3;

/// The switch shared by one connection's socket and its handlers.
#[derive(Debug, Default)]
pub struct ConnCtl {
    state: AtomicU8,
}

impl ConnCtl {
    /// Kill the connection now, with an RST, whatever hyper does next.
    pub fn reset(&self) {
        self.state.store(RESET, Ordering::SeqCst);
    }

    /// Close the connection (FIN) once what hyper has buffered so far is
    /// written.
    pub fn close_after_flush(&self) {
        let _ = self.state.compare_exchange(
            OPEN,
            CLOSE_AFTER_FLUSH,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    fn get(&self) -> u8 {
        self.state.load(Ordering::SeqCst)
    }
}

/// What a handler extracts (`ConnectInfo<ConnHandle>`) to reach its
/// connection's switch.
#[derive(Clone, Debug)]
pub struct ConnHandle(pub Arc<ConnCtl>);

impl Connected<IncomingStream<'_, CtlListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, CtlListener>) -> Self {
        ConnHandle(stream.io().ctl.clone())
    }
}

/// A TCP listener whose connections carry a [`ConnCtl`].
pub struct CtlListener(pub TcpListener);

impl Listener for CtlListener {
    type Io = CtlStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (inner, addr) = Listener::accept(&mut self.0).await;
        let stream = CtlStream {
            inner,
            ctl: Arc::default(),
        };
        (stream, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A TCP stream that fails every operation once its switch is thrown.
pub struct CtlStream {
    inner: TcpStream,
    ctl: Arc<ConnCtl>,
}

fn aborted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "mock fault: connection dropped",
    )
}

impl CtlStream {
    /// Err once the connection is (being) dropped on purpose.
    fn check(&self) -> io::Result<()> {
        match self.ctl.get() {
            CLOSED | RESET => Err(aborted()),
            _ => Ok(()),
        }
    }
}

impl Drop for CtlStream {
    fn drop(&mut self) {
        if self.ctl.get() == RESET {
            // Closing with SO_LINGER 0 sends an RST instead of a FIN. Only a
            // zero linger: a non-zero one would block the thread on close.
            let _ = self.inner.set_zero_linger();
        }
    }
}

impl AsyncRead for CtlStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CtlStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        std::task::ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        // hyper flushes the socket only once its own buffer is written out.
        if this
            .ctl
            .state
            .compare_exchange(
                CLOSE_AFTER_FLUSH,
                CLOSED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            return Poll::Ready(Err(aborted()));
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// A body that sends `head` and then, instead of the rest, closes the
/// connection (FIN) once `head` is on the wire. Never ends by itself.
pub fn truncated_body(head: Bytes, ctl: Arc<ConnCtl>) -> Body {
    let stream = futures_util::stream::unfold(Some(head), move |head| {
        let ctl = ctl.clone();
        async move {
            match head {
                Some(chunk) if !chunk.is_empty() => Some((Ok::<_, io::Error>(chunk), None)),
                _ => {
                    // hyper asks for the next frame only after buffering the
                    // chunk, so the flush this waits for carries it.
                    ctl.close_after_flush();
                    std::future::pending::<()>().await;
                    None
                }
            }
        }
    });
    Body::from_stream(stream)
}
