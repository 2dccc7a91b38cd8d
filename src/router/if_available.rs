//! `Prefer: if-available` (RFC 7240), as llm-d's coordinator sends it for a
//! speculative early decode (llm-d-router `pkg/common/routing/common.go`,
//! `pkg/epp/requestcontrol/director.go`): serve the request on a decode pod
//! only if that pod already holds part of the prompt's KV, without a
//! prefill; otherwise answer 412 so the caller runs the whole pipeline.
//!
//! What a decode pod holds is the decode prefix table's estimate, kept only
//! for models with a decider (`models[].decider`), as llm-d's EPP answers
//! 412 when no prefix scorer ran. Combined pods' caches are not tracked.
//! In executor mode the endpoint picker applies the gate and pd-router
//! carries out its picks.

use crate::error::{ClientError, PdError};
use crate::split::{Decided, Placement};

/// The reason a request served under the preference is counted under
/// (`pd_router.decisions`).
pub const IF_AVAILABLE: &str = "if_available";

/// Whether a `prefer` header value asks for `if-available`: one of its
/// comma-separated preferences, parameters after `;` ignored, any case.
pub fn prefers_if_available(value: &[u8]) -> bool {
    value.split(|b| *b == b',').any(|pref| {
        let token = pref.split(|b| *b == b';').next().unwrap_or_default();
        token.trim_ascii().eq_ignore_ascii_case(b"if-available")
    })
}

/// `placed` kept whole on its decode pod when the router knows that pod
/// holds part of the prompt; otherwise why the preference cannot be met.
pub fn serve_if_available(
    placed: Placement,
    prompt_tokens: u64,
    model: &str,
) -> Result<Placement, PdError> {
    let holds = |d: &Decided| d.uncached_tokens < prompt_tokens;
    let why = match placed {
        Placement::Split {
            decode,
            decided: Some(decided),
            ..
        } if holds(&decided) => {
            return Ok(Placement::Unsplit {
                pod: decode,
                decided: Box::new(Decided {
                    reason: IF_AVAILABLE,
                    ..*decided
                }),
            })
        }
        Placement::Unsplit { decided, .. } if !holds(&decided) => {
            "no decode pod is known to hold any of this prompt"
        }
        Placement::Unsplit { .. } => return Ok(placed),
        Placement::Split {
            decided: Some(_), ..
        } => "no decode pod is known to hold any of this prompt",
        Placement::Split { decided: None, .. } => {
            "the router tracks what decode pods hold only for models with a `decider`"
        }
        Placement::Combined { .. } => {
            "it was placed on a pod serving both phases, whose cache the router does not track"
        }
    };
    Err(PdError::Client(ClientError::NotCached(format!(
        "`Prefer: if-available` cannot be met for model `{model}`: {why}; send the request without it to run a prefill"
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Endpoint;
    use crate::sched::prefix::PrefixMatch;
    use std::rc::Rc;

    fn pod(name: &str) -> Rc<Endpoint> {
        Rc::new(Endpoint::new(
            "10.0.0.1:8000".parse().unwrap(),
            Some(name.into()),
        ))
    }

    fn decided(uncached: u64) -> Box<Decided> {
        Box::new(Decided {
            reason: "split",
            uncached_tokens: uncached,
            decode_prefix: PrefixMatch::default(),
        })
    }

    fn split(decided: Option<Box<Decided>>) -> Placement {
        Placement::Split {
            prefill: pod("p"),
            decode: pod("d"),
            reason: "test",
            prefix: PrefixMatch::default(),
            decided,
        }
    }

    #[test]
    fn the_preference_is_one_token_among_others_with_any_case_and_parameters() {
        for yes in [
            &b"if-available"[..],
            b"If-Available",
            b" respond-async , if-available ; x=1",
            b"wait=10,IF-AVAILABLE",
        ] {
            assert!(
                prefers_if_available(yes),
                "{}",
                String::from_utf8_lossy(yes)
            );
        }
        for no in [
            &b""[..],
            b"respond-async",
            b"if-available-soon",
            b"x=if-available",
        ] {
            assert!(!prefers_if_available(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn a_decode_pod_holding_part_of_the_prompt_serves_it_whole() {
        let Ok(Placement::Unsplit { pod, decided }) =
            serve_if_available(split(Some(decided(900))), 1000, "m")
        else {
            panic!("kept whole")
        };
        assert_eq!(pod.name, "d");
        assert_eq!(
            (decided.reason, decided.uncached_tokens),
            (IF_AVAILABLE, 900)
        );
    }

    #[test]
    fn the_deciders_own_unsplit_stands_when_the_pod_holds_part() {
        let placed = Placement::Unsplit {
            pod: pod("d"),
            decided: Box::new(Decided {
                reason: "cached",
                ..*decided(10)
            }),
        };
        let Ok(Placement::Unsplit { decided, .. }) = serve_if_available(placed, 1000, "m") else {
            panic!("kept whole")
        };
        assert_eq!(decided.reason, "cached");
    }

    #[test]
    fn nothing_held_or_nothing_known_is_412_saying_why() {
        let cases = [
            (split(Some(decided(1000))), "no decode pod is known"),
            (split(None), "only for models with a `decider`"),
            (
                Placement::Unsplit {
                    pod: pod("d"),
                    decided: decided(1000),
                },
                "no decode pod is known",
            ),
            (
                Placement::Combined {
                    pod: pod("c"),
                    reason: "test",
                },
                "serving both phases",
            ),
        ];
        for (placed, why) in cases {
            let err = serve_if_available(placed, 1000, "m").expect_err("refused");
            assert_eq!(err.reply().status, 412);
            let msg = err.to_string();
            assert!(msg.contains(why) && msg.contains("`m`"), "{msg}");
        }
    }
}
