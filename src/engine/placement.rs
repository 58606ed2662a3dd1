//! Execution placement (mlx-bun 0.5's `resolveExecution`): choose a request's method first, then
//! whether it can join the continuous batch, and which optional paths (paged KV, prompt cache,
//! checkpoints, fill, compiled decode, grammar jump) apply. Pure policy; `reasons` explains every
//! fallback in a fixed order. Then what this engine can do, and where each request goes.
use crate::sample::GenerateOptions;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Autoregressive,
    Speculative,
    Denoising,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Serial,
    Continuous,
}

/// What one request needs.
#[derive(Debug, Clone, Default)]
pub struct ExecutionRequirements {
    pub has_vision: bool,
    pub has_adapters: bool,
    pub has_repetition_penalty: bool,
    pub user_seed: bool,
    pub kv_quant: bool,
    pub turbo_quant: bool,
    pub has_logits_extras: bool,
    pub has_grammar: bool,
    pub wants_logprobs: bool,
    pub has_draft: bool,
    pub has_prepared_prefix_identity: bool,
}

/// What the executor can do. Flags absent in mlx-bun's optional fields default to false.
#[derive(Debug, Clone)]
pub struct ExecutionCapabilities {
    pub method: Method,
    pub continuous: bool,
    pub quantized_batch: bool,
    pub grammar_batch: bool,
    pub checkpoints: bool,
    pub compiled_decode: bool,
    pub speculative_kv_quant: bool,
    pub media_batch: bool,
    pub adapter_batch: bool,
    pub turbo_quant_batch: bool,
    pub paged_batch: bool,
    /// Methods the continuous lane can group; `None` means autoregressive only.
    pub grouped_methods: Option<Vec<Method>>,
    pub shared_speculative_adapters: bool,
    pub speculative_logprobs: bool,
    pub shared_grammar_proposals: bool,
    pub speculative_turbo_quant: bool,
    pub media_prefix_cache: bool,
    pub shared_fill: bool,
    pub shared_speculative_echo: bool,
    pub shared_checkpoints: bool,
}

impl Default for ExecutionCapabilities {
    fn default() -> Self {
        ExecutionCapabilities {
            method: Method::Autoregressive,
            continuous: false,
            quantized_batch: false,
            grammar_batch: false,
            checkpoints: false,
            compiled_decode: false,
            speculative_kv_quant: false,
            media_batch: false,
            adapter_batch: false,
            turbo_quant_batch: false,
            paged_batch: false,
            grouped_methods: None,
            shared_speculative_adapters: false,
            speculative_logprobs: false,
            shared_grammar_proposals: false,
            speculative_turbo_quant: false,
            media_prefix_cache: false,
            shared_fill: false,
            shared_speculative_echo: false,
            shared_checkpoints: false,
        }
    }
}

/// Engine-wide switches.
#[derive(Debug, Clone, Default)]
pub struct ExecutionFeatures {
    pub paged_kv: bool,
    pub fill: bool,
    pub compiled_decode: bool,
    pub grammar_jump: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedExecution {
    pub method: Method,
    pub mechanism: Mechanism,
    pub paged_kv: bool,
    pub prompt_cache: bool,
    pub checkpoint: bool,
    pub fill: bool,
    pub compiled_decode: bool,
    pub grammar_jump: bool,
    pub reasons: Vec<&'static str>,
}

pub fn resolve_execution(r: &ExecutionRequirements, c: &ExecutionCapabilities, f: &ExecutionFeatures) -> ResolvedExecution {
    let ar = c.method == Method::Autoregressive;
    let grouped = |m: Method| c.grouped_methods.as_ref().map_or(m == Method::Autoregressive, |g| g.contains(&m));
    // Exclusions every method shares; each is lifted by the matching batch capability.
    let shared = [
        (!c.continuous, "continuous-unavailable"),
        (r.has_vision && !c.media_batch, "media-requires-serial"),
        (r.has_adapters && !c.adapter_batch, "adapters-require-serial"),
        (r.kv_quant && !c.quantized_batch, "kv-scheme-requires-serial"),
        (r.turbo_quant && !c.turbo_quant_batch, "turbo-kv-requires-serial"),
        (r.has_grammar && !c.grammar_batch, "grammar-batching-disabled"),
        (f.paged_kv && !c.paged_batch, "paged-kv-requires-serial"),
    ];
    let any_shared = shared.iter().any(|(excluded, _)| *excluded);
    let shared_adapter_method = c.shared_speculative_adapters && !any_shared && grouped(Method::Speculative);
    // Speculative variants of a request's needs, each allowed only by its capability.
    let logprobs_ok = !r.wants_logprobs || c.speculative_logprobs;
    let adapters_ok = !r.has_adapters || shared_adapter_method;
    let kv_ok = !r.kv_quant || c.speculative_kv_quant;
    let turbo_ok = !r.turbo_quant || c.speculative_turbo_quant;
    let grammar_proposals = f.grammar_jump
        && r.has_grammar
        && !r.has_draft
        && !r.has_vision
        && logprobs_ok
        && !f.paged_kv
        && ar
        && c.shared_grammar_proposals
        && grouped(Method::Speculative)
        && adapters_ok
        && kv_ok
        && turbo_ok
        && !any_shared;
    let speculative = grammar_proposals
        || (ar && r.has_draft && !r.has_vision && adapters_ok && logprobs_ok && kv_ok && turbo_ok && !f.paged_kv);
    let method = if speculative { Method::Speculative } else { c.method };

    let mut reasons: Vec<&'static str> = Vec::new();
    let exclusions = std::iter::once(shared[0])
        .chain(std::iter::once((!grouped(method), "method-requires-serial")))
        .chain(shared[1..].iter().copied());
    reasons.extend(exclusions.filter(|(excluded, _)| *excluded).map(|(_, reason)| reason));
    let mechanism = if reasons.is_empty() { Mechanism::Continuous } else { Mechanism::Serial };
    let continuous = mechanism == Mechanism::Continuous;
    let serial = !continuous;
    if r.has_draft && !speculative {
        reasons.push("draft-incompatible-with-request");
    }
    let paged_kv = f.paged_kv && !r.has_vision && !r.has_adapters;
    if f.paged_kv && !paged_kv {
        reasons.push("paged-kv-bypassed-for-media-or-adapters");
    }
    let prompt_cache = method != Method::Speculative
        && (!r.has_vision || (continuous && r.has_prepared_prefix_identity && c.media_prefix_cache));
    let shared_fill = continuous && c.shared_fill && !paged_kv;
    let speculative_echo = method == Method::Speculative && continuous && c.shared_speculative_echo;
    let fill = f.fill
        && !r.has_vision
        && !r.has_grammar
        && !r.wants_logprobs
        && (speculative_echo
            || (method == Method::Autoregressive
                && (serial || shared_fill)
                && !r.has_draft
                && (!r.user_seed || shared_fill)));
    if f.fill && !fill {
        reasons.push("fill-incompatible-with-request");
    }
    let checkpoint = c.checkpoints
        && method == Method::Autoregressive
        && !r.has_vision
        && (serial || c.shared_checkpoints)
        && prompt_cache
        && !paged_kv
        && !r.has_grammar
        && !f.fill
        && !r.wants_logprobs;
    let compiled_decode = f.compiled_decode
        && c.compiled_decode
        && method == Method::Autoregressive
        && !r.has_adapters
        && !paged_kv
        && !(shared_fill && fill);
    if f.compiled_decode && !compiled_decode {
        reasons.push("compiled-decode-unavailable-for-request");
    }
    let grammar_jump = grammar_proposals
        || (f.grammar_jump && r.has_grammar && method == Method::Autoregressive && serial && !r.wants_logprobs);
    if f.grammar_jump && r.has_grammar && !grammar_jump {
        reasons.push("grammar-jump-incompatible-with-request");
    }
    ResolvedExecution { method, mechanism, paged_kv, prompt_cache, checkpoint, fill, compiled_decode, grammar_jump, reasons }
}

/// What this engine can do: every autoregressive row of a model joins the continuous batch,
/// grammar rows included (each row masks its own logits), fill rows (`sharedFill`), and
/// speculative rows: a draft model's proposals, with fill's before them (`sharedSpeculativeEcho`)
/// and logprobs at each kept position (`speculativeLogprobs`),
/// or grammar proposals (the tokens a grammar forces, fed as one multi-token step:
/// mlx-bun places those rows as the speculative method), and rows with quantized KV caches
/// (`quantizedBatch`: they share the batch's forward, attending over their own caches). Everything
/// else mlx-bun's placement knows (quantized KV under a draft, media, adapters, paged KV,
/// compiled decode) this engine does not have yet, and the requests that would need
/// it are refused before they get here (`UNSUPPORTED_OPTION`) or, for a draft, run without it.
/// `checkpoints`: the model's caches cannot be trimmed (linear attention), so its rows leave a
/// checkpoint of their caches at the end of their prompt in the prefix cache, in either lane.
pub fn capabilities(continuous: bool, checkpoints: bool) -> ExecutionCapabilities {
    ExecutionCapabilities {
        method: Method::Autoregressive,
        continuous,
        grammar_batch: continuous,
        shared_grammar_proposals: continuous,
        grouped_methods: continuous.then(|| vec![Method::Autoregressive, Method::Speculative]),
        shared_fill: continuous,
        shared_speculative_echo: continuous,
        speculative_logprobs: true,
        quantized_batch: continuous,
        checkpoints,
        shared_checkpoints: checkpoints && continuous,
        ..Default::default()
    }
}

/// The engine-wide switches an engine has turned on: of mlx-bun's, `grammarJump` and `fill`
/// (engine options).
pub fn features(grammar_jump: bool, fill: bool) -> ExecutionFeatures {
    ExecutionFeatures { grammar_jump, fill, ..Default::default() }
}

/// Where a generation request runs, and whether it uses the prefix cache. A model restored from
/// checkpoints cannot take back proposals it rejects (its caches cannot be trimmed), so a draft
/// and fill's proposals are not used there, with their reasons.
pub fn for_generation(opts: &GenerateOptions, has_draft: bool, checkpoints: bool, features: &ExecutionFeatures) -> ResolvedExecution {
    let requirements = ExecutionRequirements {
        has_repetition_penalty: opts.sampling.repetition_penalty > 0.0 && opts.sampling.repetition_penalty != 1.0,
        user_seed: opts.sampling.seed != 0,
        has_logits_extras: !opts.sampling.logit_bias.is_empty(),
        wants_logprobs: opts.wants_logprobs(),
        has_grammar: opts.grammar.is_some(),
        has_draft: has_draft && !checkpoints,
        kv_quant: opts.kv.is_on(),
        ..Default::default()
    };
    let usable = ExecutionFeatures { fill: features.fill && !checkpoints, ..features.clone() };
    let mut placed = resolve_execution(&requirements, &capabilities(true, checkpoints), &usable);
    if checkpoints && has_draft {
        placed.reasons.push("draft-incompatible-with-request");
    }
    if checkpoints && features.fill {
        placed.reasons.push("fill-incompatible-with-request");
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batching() -> ExecutionCapabilities {
        ExecutionCapabilities { continuous: true, ..Default::default() }
    }

    fn resolve(r: ExecutionRequirements, c: &ExecutionCapabilities, f: ExecutionFeatures) -> ResolvedExecution {
        resolve_execution(&r, c, &f)
    }

    #[test]
    fn a_plain_request_batches_with_the_prompt_cache() {
        let e = resolve(Default::default(), &batching(), Default::default());
        assert_eq!(e.method, Method::Autoregressive);
        assert_eq!(e.mechanism, Mechanism::Continuous);
        assert!(e.prompt_cache && !e.paged_kv && !e.checkpoint && !e.fill && !e.compiled_decode && !e.grammar_jump);
        assert!(e.reasons.is_empty());
        // 0.5: logprobs and a user seed no longer force serial placement.
        let r = ExecutionRequirements { wants_logprobs: true, user_seed: true, ..Default::default() };
        assert_eq!(resolve(r, &batching(), Default::default()).mechanism, Mechanism::Continuous);
    }

    #[test]
    fn every_serial_reason_in_order() {
        let r = ExecutionRequirements {
            has_vision: true,
            has_adapters: true,
            kv_quant: true,
            turbo_quant: true,
            has_grammar: true,
            ..Default::default()
        };
        let c = ExecutionCapabilities { method: Method::Denoising, ..Default::default() };
        let f = ExecutionFeatures { paged_kv: true, ..Default::default() };
        let e = resolve(r, &c, f);
        assert_eq!(e.mechanism, Mechanism::Serial);
        assert_eq!(
            e.reasons,
            [
                "continuous-unavailable",
                "method-requires-serial",
                "media-requires-serial",
                "adapters-require-serial",
                "kv-scheme-requires-serial",
                "turbo-kv-requires-serial",
                "grammar-batching-disabled",
                "paged-kv-requires-serial",
                "paged-kv-bypassed-for-media-or-adapters",
            ]
        );
    }

    #[test]
    fn batch_capabilities_lift_their_exclusions() {
        let r = ExecutionRequirements { has_vision: true, has_adapters: true, kv_quant: true, turbo_quant: true, has_grammar: true, ..Default::default() };
        let c = ExecutionCapabilities {
            media_batch: true,
            adapter_batch: true,
            quantized_batch: true,
            turbo_quant_batch: true,
            grammar_batch: true,
            paged_batch: true,
            ..batching()
        };
        let e = resolve(r, &c, ExecutionFeatures { paged_kv: true, ..Default::default() });
        assert_eq!(e.mechanism, Mechanism::Continuous);
        // Media without a prepared prefix identity bypasses the prompt cache and paged KV.
        assert!(!e.prompt_cache && !e.paged_kv);
        assert_eq!(e.reasons, ["paged-kv-bypassed-for-media-or-adapters"]);
    }

    #[test]
    fn drafts_go_speculative_only_when_the_request_allows() {
        let c = ExecutionCapabilities { grouped_methods: Some(vec![Method::Autoregressive, Method::Speculative]), ..batching() };
        let e = resolve(ExecutionRequirements { has_draft: true, ..Default::default() }, &c, Default::default());
        assert_eq!((e.method, e.mechanism), (Method::Speculative, Mechanism::Continuous));
        assert!(!e.prompt_cache);
        // Without speculative grouping the method is kept but placement turns serial.
        let e = resolve(ExecutionRequirements { has_draft: true, ..Default::default() }, &batching(), Default::default());
        assert_eq!((e.method, e.mechanism), (Method::Speculative, Mechanism::Serial));
        assert_eq!(e.reasons, ["method-requires-serial"]);
        for r in [
            ExecutionRequirements { has_draft: true, has_vision: true, ..Default::default() },
            ExecutionRequirements { has_draft: true, wants_logprobs: true, ..Default::default() },
            ExecutionRequirements { has_draft: true, kv_quant: true, ..Default::default() },
            ExecutionRequirements { has_draft: true, turbo_quant: true, ..Default::default() },
            ExecutionRequirements { has_draft: true, has_adapters: true, ..Default::default() },
        ] {
            let e = resolve(r.clone(), &c, Default::default());
            assert_eq!(e.method, Method::Autoregressive, "{r:?}");
            assert!(e.reasons.contains(&"draft-incompatible-with-request"), "{r:?}");
        }
        // Each speculative capability re-enables its case.
        let c2 = ExecutionCapabilities { speculative_logprobs: true, speculative_kv_quant: true, speculative_turbo_quant: true, shared_speculative_adapters: true, adapter_batch: true, ..c.clone() };
        let r = ExecutionRequirements { has_draft: true, wants_logprobs: true, kv_quant: true, turbo_quant: true, has_adapters: true, ..Default::default() };
        assert_eq!(resolve(r.clone(), &ExecutionCapabilities { quantized_batch: true, turbo_quant_batch: true, ..c2 }, Default::default()).method, Method::Speculative);
        assert_eq!(resolve(r, &c, ExecutionFeatures { paged_kv: true, ..Default::default() }).method, Method::Autoregressive);
    }

    #[test]
    fn grammar_proposals_make_grammar_requests_speculative() {
        let c = ExecutionCapabilities {
            grammar_batch: true,
            shared_grammar_proposals: true,
            grouped_methods: Some(vec![Method::Autoregressive, Method::Speculative]),
            ..batching()
        };
        let f = ExecutionFeatures { grammar_jump: true, ..Default::default() };
        let e = resolve(ExecutionRequirements { has_grammar: true, ..Default::default() }, &c, f.clone());
        assert_eq!((e.method, e.mechanism), (Method::Speculative, Mechanism::Continuous));
        assert!(e.grammar_jump);
        // A draft takes precedence over grammar proposals; logprobs block them without the capability.
        let e = resolve(ExecutionRequirements { has_grammar: true, wants_logprobs: true, ..Default::default() }, &c, f.clone());
        assert_eq!(e.method, Method::Autoregressive);
        assert!(!e.grammar_jump);
        assert_eq!(e.reasons, ["grammar-jump-incompatible-with-request"]);
        // The serial rule: autoregressive grammar requests jump when placed serially.
        let e = resolve(ExecutionRequirements { has_grammar: true, ..Default::default() }, &ExecutionCapabilities::default(), f);
        assert_eq!((e.method, e.mechanism, e.grammar_jump), (Method::Autoregressive, Mechanism::Serial, true));
    }

    #[test]
    fn a_model_restored_from_checkpoints_takes_no_proposals() {
        let opts = GenerateOptions::default();
        let fill = features(false, true);
        let p = for_generation(&opts, true, true, &fill);
        assert_eq!((p.method, p.fill, p.checkpoint, p.prompt_cache), (Method::Autoregressive, false, true, true));
        assert_eq!(p.reasons, ["draft-incompatible-with-request", "fill-incompatible-with-request"]);
        // Any other model speculates with its draft.
        let p = for_generation(&opts, true, false, &fill);
        assert_eq!((p.method, p.checkpoint), (Method::Speculative, false));
    }

    #[test]
    fn fill_checkpoint_and_compiled_decode() {
        let fill = ExecutionFeatures { fill: true, ..Default::default() };
        // Serial AR requests fill; continuous ones only with shared fill.
        assert!(resolve(Default::default(), &ExecutionCapabilities::default(), fill.clone()).fill);
        let e = resolve(Default::default(), &batching(), fill.clone());
        assert!(!e.fill);
        assert_eq!(e.reasons, ["fill-incompatible-with-request"]);
        let shared = ExecutionCapabilities { shared_fill: true, compiled_decode: true, ..batching() };
        let both = ExecutionFeatures { fill: true, compiled_decode: true, ..Default::default() };
        let e = resolve(ExecutionRequirements { user_seed: true, ..Default::default() }, &shared, both);
        assert!(e.fill && !e.compiled_decode);
        assert_eq!(e.reasons, ["compiled-decode-unavailable-for-request"]);
        for r in [
            ExecutionRequirements { has_vision: true, ..Default::default() },
            ExecutionRequirements { has_grammar: true, ..Default::default() },
            ExecutionRequirements { wants_logprobs: true, ..Default::default() },
            ExecutionRequirements { has_draft: true, ..Default::default() },
        ] {
            assert!(!resolve(r, &ExecutionCapabilities::default(), fill.clone()).fill);
        }
        // Checkpoints: serial AR with the prompt cache, or continuous with shared checkpoints.
        let cp = ExecutionCapabilities { checkpoints: true, ..Default::default() };
        assert!(resolve(Default::default(), &cp, Default::default()).checkpoint);
        assert!(!resolve(Default::default(), &cp, fill).checkpoint);
        let cp_c = ExecutionCapabilities { checkpoints: true, ..batching() };
        assert!(!resolve(Default::default(), &cp_c, Default::default()).checkpoint);
        let cp_s = ExecutionCapabilities { shared_checkpoints: true, ..cp_c };
        assert!(resolve(Default::default(), &cp_s, Default::default()).checkpoint);
        assert!(!resolve(ExecutionRequirements { wants_logprobs: true, ..Default::default() }, &cp_s, Default::default()).checkpoint);
        let compiled = ExecutionCapabilities { compiled_decode: true, ..batching() };
        let f = ExecutionFeatures { compiled_decode: true, ..Default::default() };
        assert!(resolve(Default::default(), &compiled, f.clone()).compiled_decode);
        assert!(!resolve(ExecutionRequirements { has_adapters: true, ..Default::default() }, &compiled, f).compiled_decode);
    }

    #[test]
    fn media_uses_the_prompt_cache_only_with_a_prepared_prefix_identity() {
        let c = ExecutionCapabilities { media_batch: true, media_prefix_cache: true, ..batching() };
        let r = ExecutionRequirements { has_vision: true, has_prepared_prefix_identity: true, ..Default::default() };
        assert!(resolve(r.clone(), &c, Default::default()).prompt_cache);
        assert!(!resolve(r, &ExecutionCapabilities { media_prefix_cache: false, ..c }, Default::default()).prompt_cache);
    }

    /// Every single and pairwise flip of the boolean inputs: properties the rules guarantee.
    #[test]
    fn covering_set_keeps_the_rules_invariants() {
        const N: usize = 11 + 16 + 4;
        let build = |bits: [bool; N]| {
            let r = ExecutionRequirements {
                has_vision: bits[0],
                has_adapters: bits[1],
                has_repetition_penalty: bits[2],
                user_seed: bits[3],
                kv_quant: bits[4],
                turbo_quant: bits[5],
                has_logits_extras: bits[6],
                has_grammar: bits[7],
                wants_logprobs: bits[8],
                has_draft: bits[9],
                has_prepared_prefix_identity: bits[10],
            };
            let c = ExecutionCapabilities {
                method: Method::Autoregressive,
                continuous: !bits[11],
                quantized_batch: bits[12],
                grammar_batch: bits[13],
                checkpoints: bits[14],
                compiled_decode: bits[15],
                speculative_kv_quant: bits[16],
                media_batch: bits[17],
                adapter_batch: bits[18],
                turbo_quant_batch: bits[19],
                paged_batch: bits[20],
                grouped_methods: bits[21].then(|| vec![Method::Autoregressive, Method::Speculative]),
                shared_speculative_adapters: bits[22],
                speculative_logprobs: bits[23],
                shared_grammar_proposals: bits[24],
                speculative_turbo_quant: bits[25],
                media_prefix_cache: bits[26],
                shared_fill: false,
                shared_speculative_echo: false,
                shared_checkpoints: false,
            };
            let f = ExecutionFeatures { paged_kv: bits[27], fill: bits[28], compiled_decode: bits[29], grammar_jump: bits[30] };
            (r, c, f)
        };
        let mut cases = vec![[false; N]];
        for i in 0..N {
            for j in i..N {
                let mut b = [false; N];
                b[i] = true;
                b[j] = true;
                cases.push(b);
            }
        }
        for bits in cases {
            let (r, c, f) = build(bits);
            let e = resolve_execution(&r, &c, &f);
            let placement = ["continuous-unavailable", "method-requires-serial", "media-requires-serial", "adapters-require-serial", "kv-scheme-requires-serial", "turbo-kv-requires-serial", "grammar-batching-disabled", "paged-kv-requires-serial"];
            let serial = e.reasons.iter().any(|x| placement.contains(x));
            assert_eq!(e.mechanism == Mechanism::Serial, serial, "{bits:?}");
            if e.method == Method::Speculative {
                assert!(r.has_draft || (r.has_grammar && f.grammar_jump && e.grammar_jump), "{bits:?}");
            }
            if r.has_draft {
                assert_eq!(e.method == Method::Speculative, !e.reasons.contains(&"draft-incompatible-with-request"), "{bits:?}");
            }
            if e.fill {
                assert!(f.fill && !r.has_vision && !r.has_grammar && !r.wants_logprobs, "{bits:?}");
            }
            if e.paged_kv {
                assert!(f.paged_kv && !r.has_vision && !r.has_adapters, "{bits:?}");
            }
            if e.checkpoint {
                assert!(c.checkpoints && e.prompt_cache && !f.fill && !r.wants_logprobs, "{bits:?}");
            }
            if e.compiled_decode {
                assert!(f.compiled_decode && c.compiled_decode && !r.has_adapters, "{bits:?}");
            }
            assert_eq!(e.reasons.contains(&"fill-incompatible-with-request"), f.fill && !e.fill, "{bits:?}");
            assert_eq!(e.reasons.contains(&"compiled-decode-unavailable-for-request"), f.compiled_decode && !e.compiled_decode, "{bits:?}");
            assert_eq!(e.reasons.contains(&"grammar-jump-incompatible-with-request"), f.grammar_jump && r.has_grammar && !e.grammar_jump, "{bits:?}");
            // Needs that 0.5 batches without any capability never force serial placement.
            let relaxed = ExecutionRequirements { wants_logprobs: false, user_seed: false, has_repetition_penalty: false, has_logits_extras: false, ..r.clone() };
            if !r.has_draft && !r.has_grammar {
                assert_eq!(resolve_execution(&relaxed, &c, &f).mechanism, e.mechanism, "{bits:?}");
            }
        }
    }
}
