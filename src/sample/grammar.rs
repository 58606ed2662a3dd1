//! Grammar-constrained decoding with llguidance: a request's grammar (a JSON schema, a regular
//! expression or a Lark grammar) becomes a matcher that, before each sampling step, says which
//! tokens may come next; the others get -inf logits. EOS is allowed only where the grammar may
//! end, and the row ends by itself once the grammar cannot go on.
//!
//! llguidance needs every token's bytes and a tokenizer (`toktrie::TokenizerEnv`). Its adapter
//! crate `toktrie_hf_tokenizers` is built on `tokenizers` 0.21, and we use 0.22 (two copies of
//! the tokenizer crate, and two tokenizer loads, per model): so the environment is built here,
//! from llguidance's own tokenizer.json reader and our tokenizer, once per model folder.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use mlx_rs::{ops, Array};
use serde_json::Value as Json;

use crate::error::{catch_panic, Error, Result};
use crate::tokenizer::load_tokenizer;

/// Whitespace allowed between two JSON tokens: one space, or one or two newlines and an indent.
pub const JSON_WHITESPACE: &str = r"( |\n{1,2}[ \t]{0,20})";

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON document valid against this JSON schema (`{}` or `true`: any JSON value).
    JsonSchema(Json),
    Regex(String),
    /// llguidance's Lark dialect.
    Lark(String),
}

impl GrammarSpec {
    /// `{ jsonSchema } | { regex } | { lark }` (exactly one key), as requests write it.
    pub fn from_json(v: &Json) -> Result<Self> {
        let bad = |reason: String| Error::option("grammar", reason);
        let Some(o) = v.as_object().filter(|o| o.len() == 1) else {
            return Err(bad("must be an object with exactly one of jsonSchema, regex, lark".into()));
        };
        let (key, value) = o.iter().next().expect("one key");
        match (key.as_str(), value) {
            ("jsonSchema", s) if s.is_object() || s.is_boolean() => Ok(GrammarSpec::JsonSchema(s.clone())),
            ("regex", Json::String(r)) => Ok(GrammarSpec::Regex(r.clone())),
            ("lark", Json::String(l)) => Ok(GrammarSpec::Lark(l.clone())),
            ("jsonSchema", _) => Err(bad("jsonSchema must be a JSON schema object".into())),
            ("regex" | "lark", _) => Err(bad(format!("{key} must be a string"))),
            (other, _) => Err(bad(format!("unknown grammar kind '{other}' (expected jsonSchema, regex or lark)"))),
        }
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonSchema(s) => {
                // llguidance allows any run of whitespace between JSON tokens by default, and a
                // small model can loop on newlines until its token limit: bound it as
                // llama.cpp's schema grammars do, unless the schema sets its own options.
                let mut s = s.clone();
                if let Some(o) = s.as_object_mut().filter(|o| !o.contains_key("x-guidance")) {
                    o.insert("x-guidance".into(), serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
                }
                TopLevelGrammar::from_json_schema(s)
            }
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        }
    }

    /// Compiles the grammar against a byte-level vocabulary (cheap: no model tokenizer), so a
    /// request with a grammar llguidance rejects fails when it is opened (`INVALID_GRAMMAR`).
    pub fn check(&self) -> Result<()> {
        static BYTES: OnceLock<std::result::Result<ParserFactory, String>> = OnceLock::new();
        let factory = BYTES.get_or_init(|| {
            let env = llguidance::toktrie::ApproximateTokEnv::single_byte_env();
            let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            f.quiet();
            Ok(f)
        });
        let factory = factory.as_ref().map_err(|e| Error::Internal(format!("grammar: {e}")))?;
        compile(factory, self).map(drop)
    }
}

fn compile(factory: &ParserFactory, spec: &GrammarSpec) -> Result<Matcher> {
    let matcher = catch_panic(|| Ok(Matcher::new(factory.create_parser(spec.top_level()))))?;
    match matcher.get_error() {
        Some(e) => Err(Error::InvalidGrammar(e)),
        None => Ok(matcher),
    }
}

/// A model's vocabulary as llguidance sees it, with a parser factory; shared by every request
/// on that model.
pub struct GrammarEnv {
    factory: ParserFactory,
    vocab: usize,
    /// The tokenizer's end-of-sequence ids, which llguidance allows where the grammar may end;
    /// a request allows its own stop tokens instead.
    eos: Vec<u32>,
}

type Slot = Arc<OnceLock<std::result::Result<Arc<GrammarEnv>, String>>>;

/// Environments by model folder (or GGUF file) and logits width, built once.
fn slot(path: &Path, vocab: usize) -> Slot {
    static ENVS: OnceLock<Mutex<HashMap<(PathBuf, usize), Slot>>> = OnceLock::new();
    let mut envs = ENVS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    envs.entry((path.to_path_buf(), vocab)).or_default().clone()
}

/// The environment of the model at `path` whose logits have `vocab` columns, built by the first
/// grammar request on that model (it reads and indexes the whole tokenizer: tens of
/// milliseconds for a small vocabulary, up to a second for a large one).
pub fn env(path: &Path, vocab: usize) -> Result<Arc<GrammarEnv>> {
    let slot = slot(path, vocab);
    let built = slot.get_or_init(|| build(path, vocab).map_err(|e| format!("{}: {e}", e.code())));
    built.clone().map_err(|e| Error::Tokenizer(format!("grammar vocabulary: {e}")))
}

fn build(path: &Path, vocab: usize) -> Result<Arc<GrammarEnv>> {
    catch_panic(|| {
        let (tokenizer, _) = load_tokenizer(path)?;
        let inner = tokenizer.inner().clone();
        let json: Json = serde_json::from_str(&inner.to_string(false).map_err(|e| Error::Tokenizer(e.to_string()))?)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| Error::Tokenizer(e.to_string()))?;
        // The logits may have more columns than the tokenizer has tokens (padded embeddings):
        // those ids become special tokens no grammar allows.
        let size = words.len().max(vocab);
        for id in words.len()..size {
            let mut name = format!(".<[{id}]>").into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let eos = tokenizer.eos_token_ids().to_vec();
        // llguidance needs an end-of-sequence id: a tokenizer without one gets a special token
        // past the logits, which no mask can allow.
        let trie_eos = match eos.first() {
            Some(&id) => id,
            None => {
                let mut name = b".<|no eos|>".to_vec();
                name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
                words.push(name);
                (words.len() - 1) as u32
            }
        };
        let info = TokRxInfo::new(words.len() as u32, trie_eos);
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        let tok_env: TokEnv = Arc::new(HfEnv { trie, tokenizer: inner });
        let mut factory = ParserFactory::new_simple(&tok_env).map_err(|e| Error::Internal(format!("grammar: {e}")))?;
        factory.quiet();
        Ok(Arc::new(GrammarEnv { factory, vocab, eos }))
    })
}

/// llguidance's view of our tokenizer: the trie of token bytes, and canonical tokenization of
/// forced text through the model's own tokenizer.
struct HfEnv {
    trie: TokTrie,
    tokenizer: Arc<tokenizers::Tokenizer>,
}

impl TokenizerEnv for HfEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            // A text the tokenizer cannot take falls back to the trie's greedy split.
            self.tokenizer.encode(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

/// One request's grammar state: what it has consumed, what may come next.
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
    tokenizer_eos: Vec<u32>,
}

impl Constraint {
    /// A constraint over the vocabulary of the model at `path`, whose logits have `vocab`
    /// columns (its environment built on first use, see `env`).
    pub fn for_model(path: &Path, vocab: usize, spec: &GrammarSpec) -> Result<Self> {
        Constraint::new(&*env(path, vocab)?, spec)
    }

    pub fn new(env: &GrammarEnv, spec: &GrammarSpec) -> Result<Self> {
        Ok(Constraint { matcher: compile(&env.factory, spec)?, vocab: env.vocab, tokenizer_eos: env.eos.clone() })
    }

    /// The tokens allowed next, as a [1, V] boolean array; `eos`: the request's stop tokens,
    /// allowed where the grammar may end. No token allowed is an error (the grammar is stuck).
    pub fn mask(&mut self, eos: &[u32]) -> Result<Array> {
        let vob = self.matcher.compute_mask().map_err(|e| Error::InvalidGrammar(e.to_string()))?;
        let accepting = self.matcher.is_accepting().unwrap_or(false);
        let mut allowed = vec![false; self.vocab];
        vob.iter_set_entries(|i| {
            if let Some(a) = allowed.get_mut(i) {
                *a = true;
            }
        });
        for (&id, stop) in self.tokenizer_eos.iter().map(|id| (id, false)).chain(eos.iter().map(|id| (id, accepting))) {
            if let Some(a) = allowed.get_mut(id as usize) {
                *a = stop;
            }
        }
        let any = allowed.contains(&true);
        if !any {
            return Err(Error::InvalidGrammar("no token can continue the output under the grammar".into()));
        }
        Ok(Array::from_slice(&allowed, &[1, self.vocab as i32]))
    }

    /// Takes a token the mask allowed.
    pub fn consume(&mut self, id: u32) -> Result<()> {
        self.matcher.consume_token(id).map_err(|e| Error::InvalidGrammar(e.to_string()))
    }

    /// The grammar is complete and nothing may follow: the output ends here.
    pub fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Tokens the grammar forces next (the only continuation), already consumed.
    pub fn forced(&mut self) -> Vec<u32> {
        self.matcher.consume_ff_tokens()
    }
}

/// `logits` [1, V] with every token `allowed` leaves out at -inf.
pub fn apply(logits: &Array, allowed: &Array) -> Result<Array> {
    Ok(ops::select(allowed, logits, Array::from_f32(f32::NEG_INFINITY).as_dtype(logits.dtype())?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn specs_are_parsed_and_bad_ones_are_typed() {
        let spec = GrammarSpec::from_json(&json!({ "regex": "[0-9]+" })).unwrap();
        assert_eq!(spec, GrammarSpec::Regex("[0-9]+".into()));
        spec.check().unwrap();
        GrammarSpec::from_json(&json!({ "jsonSchema": { "type": "object" } })).unwrap().check().unwrap();
        GrammarSpec::from_json(&json!({ "lark": "start: \"a\" | \"b\"" })).unwrap().check().unwrap();
        for bad in [json!({}), json!({ "regex": 1 }), json!({ "regex": "a", "lark": "b" }), json!({ "yaml": "x" }), json!("a")] {
            assert_eq!(GrammarSpec::from_json(&bad).unwrap_err().code(), "INVALID_OPTION", "{bad}");
        }
        for bad in [json!({ "regex": "(" }), json!({ "lark": "start: nowhere" }), json!({ "jsonSchema": { "type": "nope" } })] {
            assert_eq!(GrammarSpec::from_json(&bad).unwrap().check().unwrap_err().code(), "INVALID_GRAMMAR", "{bad}");
        }
    }

    /// A byte-level BPE tokenizer with one token per byte and an `<eos>` token (id 256), in a
    /// model folder of its own.
    fn byte_model() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mlx-bun-grammar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut vocab = serde_json::Map::new();
        let mut next = 256u32;
        for b in 0..=255u8 {
            let c = b as char;
            let shown = if matches!(c, '!'..='~' | '\u{a1}'..='\u{ac}' | '\u{ae}'..='\u{ff}') {
                c
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            };
            vocab.insert(shown.to_string(), json!(b));
        }
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{ "id": 256, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true }],
            "normalizer": null,
            "pre_tokenizer": { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true },
            "post_processor": null,
            "decoder": { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true },
            "model": { "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                       "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": [] }
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), json!({ "eos_token": "<eos>" }).to_string()).unwrap();
        dir
    }

    fn allowed(c: &mut Constraint, eos: &[u32]) -> Vec<usize> {
        let mask: Vec<bool> = c.mask(eos).unwrap().as_slice::<bool>().to_vec();
        (0..mask.len()).filter(|&i| mask[i]).collect()
    }

    #[test]
    fn masks_follow_the_grammar_and_allow_eos_only_where_it_may_end() {
        let dir = byte_model();
        // 300 logits columns for 257 tokens: the padding ids are never allowed.
        let env = env(&dir, 300).unwrap();
        let mut c = Constraint::new(&env, &GrammarSpec::Regex("[0-9]{1,2}".into())).unwrap();
        let digits: Vec<usize> = (b'0'..=b'9').map(usize::from).collect();
        assert_eq!(allowed(&mut c, &[256]), digits);
        c.consume(u32::from(b'4')).unwrap();
        assert!(!c.finished());
        let mut then = digits.clone();
        then.push(256);
        assert_eq!(allowed(&mut c, &[256]), then, "a second digit, or the end");
        assert_eq!(allowed(&mut c, &[]), digits, "no stop token: the tokenizer's eos is not one");
        c.consume(u32::from(b'2')).unwrap();
        assert!(c.finished(), "nothing may follow two digits");

        // Forced text comes back as tokens, already consumed.
        let mut c = Constraint::new(&env, &GrammarSpec::JsonSchema(json!({
            "type": "object", "properties": { "id": { "type": "integer" } }, "required": ["id"], "additionalProperties": false,
            "x-guidance": { "whitespace_flexible": false }
        }))).unwrap();
        assert_eq!(allowed(&mut c, &[256]), vec![usize::from(b'{')]);
        let forced = c.forced();
        assert_eq!(String::from_utf8(forced.iter().map(|&t| t as u8).collect()).unwrap(), "{\"id\":");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
