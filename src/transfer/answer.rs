//! What a prefill answer carries for the decode: its `kv_transfer_params`.

use crate::body::Members;
use crate::error::EngineError;

/// The `kv_transfer_params` member of a prefill answer, if it is an object.
pub(crate) fn kv_transfer_params<'a>(
    answer: &'a [u8],
    top: &Members,
) -> Result<Option<&'a [u8]>, EngineError> {
    match top.raw_non_null(answer, "kv_transfer_params") {
        None => Ok(None),
        Some(raw) if raw.first() == Some(&b'{') => Ok(Some(raw)),
        Some(_) => Err(EngineError::BadPrefillAnswer(
            "kv_transfer_params in the prefill answer is not an object".into(),
        )),
    }
}
