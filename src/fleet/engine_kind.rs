/// The inference engines whose hand-off pd-router knows. A model names its
/// engine as free text (AIBrix's registry resolves unknown names to its
/// no-op handler); the kind is read once, where the model is built, so
/// nothing downstream compares engine names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    Vllm,
    Sglang,
    Trtllm,
    /// Any other name: AIBrix's `DefaultHandler` (no hand-off fields).
    Default,
}

impl EngineKind {
    pub fn of(name: &str) -> EngineKind {
        match name {
            "vllm" => EngineKind::Vllm,
            "sglang" => EngineKind::Sglang,
            "trtllm" => EngineKind::Trtllm,
            _ => EngineKind::Default,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Trtllm => "trtllm",
            EngineKind::Default => "default",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_engines_are_default() {
        for k in [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Trtllm] {
            assert_eq!(EngineKind::of(k.name()), k);
        }
        assert_eq!(EngineKind::of("lmdeploy"), EngineKind::Default);
        assert_eq!(EngineKind::of("VLLM"), EngineKind::Default);
    }
}
