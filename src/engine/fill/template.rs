//! Strict rows compiled from a chat template and a request's tools: the template is its own
//! oracle. The same conversation is rendered with several probe tool calls and each rendering
//! tokenized; what does not change between them is the template's fixed scaffold, which the
//! model must write whatever it decides. Nothing here knows a tool-call format.
//!
//! Two rules keep the rows honest:
//! 1. Every span is cut from a rendering the model could produce, with the request's real tool
//!    names and keys: the probes only decide where to cut. (A tokenizer merges across the
//!    template's punctuation, so a span cut from a placeholder name could end at a token
//!    boundary the real stream never has.)
//! 2. A row fires only after the model wrote a distinctive token (one with letters), with leading
//!    whitespace dropped from its trigger: a bare `}` or `"` never arms a row.
//!
//! A template that renders no tool calls gives identical probes, hence no rows: it degrades to no
//! fill, never to wrong output.
use std::collections::HashMap;

use serde_json::{json, Map, Value as Json};

use super::{FillKind, FillPlan, FillRow};
use crate::tokenizer::template::{ChatTemplate, RenderOptions};
use crate::tokenizer::Tokenizer;

// Probe values, chosen so no two share a first or last character run (diffs are taken from both
// ends). The name and key guards only test whether the template renders names and keys at all;
// nothing is cut from a rendering that carries them.
const NAME_GUARD: &str = "zzalphatoolqq";
const KEY_ALT: &str = "zzalphakeyqq";
const VALUE_A: &str = "zzalphavalqq";
const VALUE_B: &str = "wwbetavalmm";
const VALUE_NUM: i64 = 987_654;
const CONTENT_A: &str = "zzalphatextqq";
const CONTENT_B: &str = "wwbetatextmm";
// Call ids differ per probe: a template that renders them would otherwise bake one into the
// "fixed" scaffold.
const ID_A: &str = "call_zzalphaidqq";
const ID_B: &str = "call_wwbetaidmm";
const ID_N: &str = "call_vvgammaidkk";

/// Tools compiled per request (each costs a few renders).
const MAX_TOOLS: usize = 32;
/// A scaffold longer than this is a diff gone wrong, not punctuation.
const MAX_SPAN: usize = 64;
/// Tokens a name row may need to tell one tool from the others.
const MAX_NAME_TRIGGER: usize = 8;

struct Probe<'a> {
    template: &'a ChatTemplate,
    tokenizer: &'a Tokenizer,
    messages: &'a [Json],
    tools: Json,
    extra: &'a Map<String, Json>,
    base_text: String,
    base: Vec<u32>,
    pieces: std::cell::RefCell<HashMap<u32, String>>,
}

impl Probe<'_> {
    fn render(&self, extra_message: Option<Json>, generation_prompt: bool) -> Option<String> {
        let mut messages = self.messages.to_vec();
        messages.extend(extra_message);
        let opts = RenderOptions { add_generation_prompt: generation_prompt, tools: Some(self.tools.clone()), extra: self.extra.clone() };
        self.template.render(&Json::Array(messages), &opts).ok()
    }

    /// The ids of the assistant turn after the generation prompt: the whole rendering's ids past
    /// the prompt's, or, where the prompt's last token merges with the reply's first, the reply's
    /// text tokenized on its own (what the model produces after the prompt ids anyway).
    fn after(&self, rendered: &str) -> Option<Vec<u32>> {
        let ids = self.tokenizer.encode(rendered, false).ok()?;
        if ids.starts_with(&self.base) {
            return Some(ids[self.base.len()..].to_vec());
        }
        let reply = rendered.strip_prefix(self.base_text.as_str())?;
        self.tokenizer.encode(reply, false).ok()
    }

    fn call(&self, name: &str, args: Json, id: &str) -> Option<Vec<u32>> {
        let message = json!({"role": "assistant", "content": "", "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": args}}]});
        self.after(&self.render(Some(message), false)?)
    }

    fn content(&self, text: &str) -> Option<Vec<u32>> {
        self.after(&self.render(Some(json!({"role": "assistant", "content": text})), false)?)
    }

    fn piece_is(&self, id: u32, test: fn(&str) -> bool) -> bool {
        let mut pieces = self.pieces.borrow_mut();
        let piece = pieces.entry(id).or_insert_with(|| self.tokenizer.decode(&[id], false).unwrap_or_default());
        test(piece)
    }

    /// A token with a letter: content, not punctuation the model could write anywhere (`</` is
    /// markup, yet it opens every closing tag of ordinary HTML).
    fn distinctive(&self, id: u32) -> bool {
        self.piece_is(id, |p| p.chars().any(|c| c.is_ascii_alphabetic()))
    }

    fn whitespace(&self, id: u32) -> bool {
        self.piece_is(id, |p| !p.is_empty() && p.chars().all(char::is_whitespace))
    }

    fn leading_skip(&self, span: &[u32]) -> usize {
        span.iter().take_while(|&&id| self.whitespace(id)).count()
    }

    /// A span split into the trigger the model writes itself (through its first distinctive
    /// token, leading whitespace dropped: it is often the newline joining the previous message)
    /// and the tokens appended; `None` when nothing distinctive anchors it or under 2 remain.
    fn anchored(&self, span: &[u32], kind: FillKind) -> Option<FillRow> {
        let rest = &span[self.leading_skip(span)..];
        let k = rest.iter().position(|&id| self.distinctive(id))?;
        let emit = rest[k + 1..].to_vec();
        (emit.len() >= 2).then(|| FillRow { trigger: rest[..=k].to_vec(), emit, kind })
    }
}

/// A tool's name and its `parameters`' keys (in order), required keys, and whether it is closed.
fn keys_of(tool: &Json) -> (Vec<String>, Vec<String>, bool) {
    let params = tool.pointer("/function/parameters");
    let keys = params.and_then(|p| p.get("properties")).and_then(Json::as_object).map(|o| o.keys().cloned().collect()).unwrap_or_default();
    let required = params
        .and_then(|p| p.get("required"))
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    let closed = params.and_then(|p| p.get("additionalProperties")) == Some(&Json::Bool(false));
    (keys, required, closed)
}

/// The key the schema determines: the only property, required; or the only required one of a
/// closed object.
fn determined_key(tool: &Json) -> Option<String> {
    let (keys, required, closed) = keys_of(tool);
    if keys.len() == 1 && required.contains(&keys[0]) {
        return Some(keys[0].clone());
    }
    (required.len() == 1 && closed && keys.contains(&required[0])).then(|| required[0].clone())
}

/// How much of one tool's call is determined once the model chose that tool: the call's opening,
/// the name, and the fixed structure up to the first position the model fills (through the key
/// when the schema determines it). Always a prefix of a real-name rendering.
fn determined_span(p: &Probe<'_>, tool: &Json, name: &str) -> Option<Vec<u32>> {
    let arg = |k: &str, v: Json| json!({ k: v });
    if let Some(key) = determined_key(tool) {
        // The number variant keeps it type-agnostic: a string opens with a quote, a number not.
        let a = p.call(name, arg(&key, json!(VALUE_A)), ID_A)?;
        let b = p.call(name, arg(&key, json!(VALUE_B)), ID_B)?;
        let n = p.call(name, arg(&key, json!(VALUE_NUM)), ID_N)?;
        return (a != b && a != n).then(|| common_prefix(&common_prefix(&a, &b), &n));
    }
    let (keys, ..) = keys_of(tool);
    let (a, b) = if keys.len() >= 2 {
        (p.call(name, arg(&keys[0], json!(VALUE_A)), ID_A)?, p.call(name, arg(&keys[1], json!(VALUE_A)), ID_B)?)
    } else {
        let a = match keys.first() {
            Some(k) => p.call(name, arg(k, json!(VALUE_A)), ID_A)?,
            None => p.call(name, json!({}), ID_A)?,
        };
        (a, p.call(name, arg(KEY_ALT, json!(VALUE_A)), ID_B)?)
    };
    (a != b).then(|| common_prefix(&a, &b))
}

/// Tokens after `at` that tell this span from every other tool's; `None` if more than the cap.
fn disambiguation(span: &[u32], at: usize, all: &[(String, Vec<u32>)]) -> Option<usize> {
    let cap = MAX_NAME_TRIGGER.min(span.len() - at);
    (1..=cap).find(|&k| all.iter().filter(|(_, s)| s.as_slice() != span).all(|(_, s)| s.len() < at + k || s[at..at + k] != span[at..at + k]))
}

/// The strict rows (and value delimiters) of a request rendered with `template` from `messages`
/// with `tools` (OpenAI's shape) and template variables `extra`; empty when the template
/// determines nothing, or fails on a probe.
pub fn compile(template: &ChatTemplate, tokenizer: &Tokenizer, messages: &[Json], tools: &[Json], extra: &Map<String, Json>) -> FillPlan {
    let tools: Vec<Json> = tools.iter().take(MAX_TOOLS).cloned().collect();
    if tools.is_empty() {
        return FillPlan::default();
    }
    let mut probe = Probe {
        template,
        tokenizer,
        messages,
        tools: Json::Array(tools.clone()),
        extra,
        base_text: String::new(),
        base: Vec::new(),
        pieces: Default::default(),
    };
    let Some(base_text) = probe.render(None, true) else { return FillPlan::default() };
    let Ok(base) = tokenizer.encode(&base_text, false) else { return FillPlan::default() };
    probe.base_text = base_text;
    probe.base = base;
    rows(&probe, &tools).unwrap_or_default()
}

fn rows(p: &Probe<'_>, tools: &[Json]) -> Option<FillPlan> {
    let spans: Vec<(String, Vec<u32>)> = tools
        .iter()
        .filter_map(|t| {
            let name = t.pointer("/function/name").and_then(Json::as_str).filter(|n| !n.is_empty())?;
            let span = determined_span(p, t, name)?;
            (!span.is_empty() && span.len() <= MAX_SPAN).then(|| (name.to_owned(), span))
        })
        .collect();
    let (first_name, first_span) = spans.first()?;
    // Does the template render the name at all? Identical renderings: nothing is determined by
    // the model's choice of tool.
    let guard = p.call(NAME_GUARD, json!({ KEY_ALT: VALUE_A }), ID_A)?;
    let real = p.call(first_name, json!({ KEY_ALT: VALUE_A }), ID_A)?;
    if guard == real {
        return None;
    }
    // The scaffold is what every tool's rendering shares: with several tools it ends where their
    // real, merged name tokens diverge.
    let scaffold = spans.iter().skip(1).fold(first_span.clone(), |s, (_, other)| common_prefix(&s, other));
    if scaffold.is_empty() {
        return None;
    }
    let anchor = p.leading_skip(&scaffold);
    let mut plan = FillPlan::default();
    plan.rows.extend(p.anchored(&scaffold, FillKind::Scaffold));
    // A name row fires on the shortest run after the scaffold that identifies one tool, and
    // carries the rest of that tool's determined span. Its trigger starts at the scaffold row's
    // anchor, so the rows chain.
    for (_, span) in &spans {
        if span.len() <= scaffold.len() {
            continue;
        }
        let Some(k) = disambiguation(span, scaffold.len(), &spans) else { continue };
        let emit = span[scaffold.len() + k..].to_vec();
        if emit.len() >= 2 {
            let trigger = [&scaffold[anchor..], &span[scaffold.len()..scaffold.len() + k]].concat();
            plan.rows.push(FillRow { trigger, emit, kind: FillKind::Name });
        }
    }
    // Two renderings of one real tool differing only in the value: their shared tail is what
    // closes the value, the call and the turn. Its first non-whitespace token ends a value.
    let close_key = keys_of(&tools[0]).0.first().cloned().unwrap_or_else(|| KEY_ALT.to_owned());
    let (Some(a), Some(b)) = (p.call(first_name, json!({ &close_key: VALUE_A }), ID_A), p.call(first_name, json!({ &close_key: VALUE_B }), ID_B)) else {
        return Some(plan);
    };
    if a == b {
        return Some(plan);
    }
    let shared_tail = common_suffix(&a, &b);
    plan.delimiters.extend(shared_tail.iter().find(|&&id| !p.whitespace(id)));
    // A close row is determined only when every call must end after its first value: every
    // tool takes exactly one, required, argument. Otherwise the model may be about to write a
    // second one, which the close would drop.
    let single = tools.iter().all(|t| {
        let (keys, required, _) = keys_of(t);
        keys.len() == 1 && required.contains(&keys[0])
    });
    if !single {
        return Some(plan);
    }
    let turn_end = match (p.content(CONTENT_A), p.content(CONTENT_B)) {
        (Some(x), Some(y)) if x != y => common_suffix(&x, &y),
        _ => Vec::new(),
    };
    let mut close = shared_tail;
    if scaffold.len() + close.len() >= a.len().min(b.len()) {
        close.clear();
    }
    if !turn_end.is_empty() && close.ends_with(&turn_end) {
        close.truncate(close.len() - turn_end.len());
    }
    if !close.is_empty() && close.len() <= MAX_SPAN {
        plan.rows.extend(p.anchored(&close, FillKind::Close));
    }
    // Usually inert (a turn end starts with the stop token, and spans are cut before it), but
    // some templates end a turn with markup first.
    if !turn_end.is_empty() && turn_end.len() <= MAX_SPAN {
        plan.rows.extend(p.anchored(&turn_end, FillKind::TurnEnd));
    }
    Some(plan)
}

fn common_prefix(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().zip(b).take_while(|(x, y)| x == y).map(|(x, _)| *x).collect()
}

fn common_suffix(a: &[u32], b: &[u32]) -> Vec<u32> {
    let n = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
    a[a.len() - n..].to_vec()
}
