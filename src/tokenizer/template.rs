//! Chat templates: the model's own Jinja template, rendered the way transformers'
//! `apply_chat_template` renders it, so prompts match what the model was trained on.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, ValueKind};
use minijinja::{Environment, ErrorKind, State, Value};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::gguf::Gguf;

const NAME: &str = "chat_template";

/// Variables transformers passes itself; `RenderOptions::extra` may not shadow them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, so the model answers next.
    pub add_generation_prompt: bool,
    /// JSON schemas of the tools the model may call (`tools` in the template).
    pub tools: Option<Json>,
    /// Further template variables, e.g. `enable_thinking`.
    pub extra: Map<String, Json>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            add_generation_prompt: true,
            tools: None,
            extra: Map::new(),
        }
    }
}

/// How a model's switchable reasoning is marked in its output, as mlx-bun names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingFormat {
    /// `<think>…</think>` in the text (Qwen3, Qwen3.5, MiniCPM).
    ThinkTag,
    /// `<|channel>thought\n…<channel|>` special tokens (Gemma 4).
    GemmaChannel,
}

impl ThinkingFormat {
    pub fn name(self) -> &'static str {
        match self {
            ThinkingFormat::ThinkTag => "think-tag",
            ThinkingFormat::GemmaChannel => "gemma-channel",
        }
    }
}

/// What one render may spend (minijinja's fuel): one unit per instruction and per 64 bytes of
/// data the template creates, so at most ~0.15 s of work and ~256 MB of strings. A conversation of
/// 1 000 messages with 30 tools spends ~33 000 through a ChatML tools template.
const TEMPLATE_FUEL: u64 = 4_000_000;

impl ChatTemplate {
    /// Compiles `source`; syntax errors are reported here rather than on first use.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        // transformers renders with jinja2's trim_blocks and lstrip_blocks; templates are
        // written for that whitespace handling.
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(template_error)?,
        );
        // A template is a model file's code: a loop without end, or a string doubled forty
        // times, must fail, not hang the caller or take its memory.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let source = source.into();
        env.add_template_owned(NAME, source.clone())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// The template of an HF-layout model folder, or `None` if it has none. Like transformers,
    /// a `chat_template.jinja` file takes precedence over `tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = super::read_json(&cfg_path)?.unwrap_or_default();
        let jinja_path = dir.join("chat_template.jinja");
        let source = match std::fs::read_to_string(&jinja_path) {
            Ok(source) => Some(source),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => config_template(&cfg, &cfg_path)?,
            Err(e) => return Err(Error::io(jinja_path, e)),
        };
        let token = |key| super::config_token(&cfg, key).map(str::to_owned);
        source
            .map(|s| Self::new(s, token("bos_token"), token("eos_token")))
            .transpose()
    }

    /// The template embedded in a GGUF file (`tokenizer.chat_template`), or `None`.
    pub fn from_gguf(g: &Gguf) -> Result<Option<Self>> {
        let Some(source) = g.get_str("tokenizer.chat_template") else {
            return Ok(None);
        };
        let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap_or_default();
        let token = |key: &str| {
            let id = usize::try_from(g.get_u64(key)?).ok()?;
            tokens.get(id).map(|t| t.to_string())
        };
        Self::new(
            source,
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        )
        .map(Some)
    }

    /// The Jinja source, as the model ships it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The reasoning channel the template switches with `enable_thinking`, if any: a template
    /// that never reads `enable_thinking` has no switch, whatever markers it mentions.
    pub fn thinking_format(&self) -> Option<ThinkingFormat> {
        if !self.source.contains("enable_thinking") {
            None
        } else if self.source.contains("<think>") {
            Some(ThinkingFormat::ThinkTag)
        } else if self.source.contains("<|channel>") {
            Some(ThinkingFormat::GemmaChannel)
        } else {
            None
        }
    }

    /// Renders a conversation: `messages` is a list of `{role, content, ...}` objects, passed
    /// to the template as is.
    pub fn render(&self, messages: &Json, opts: &RenderOptions) -> Result<String> {
        if let Some(key) = RESERVED.iter().find(|k| opts.extra.contains_key(**k)) {
            return Err(Error::Template(format!(
                "'{key}' cannot be passed as an extra variable"
            )));
        }
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("bos_token", self.bos_token.as_deref().into());
        ctx.insert("eos_token", self.eos_token.as_deref().into());
        // Like transformers' keyword arguments, extras may override the special tokens.
        for (k, v) in &opts.extra {
            ctx.insert(k, Value::from(Serde(v)));
        }
        ctx.insert("messages", Value::from(Serde(messages)));
        ctx.insert(
            "tools",
            opts.tools
                .as_ref()
                .map(|t| Value::from(Serde(t)))
                .unwrap_or(Value::from(())),
        );
        ctx.insert("documents", Value::from(()));
        ctx.insert("add_generation_prompt", opts.add_generation_prompt.into());
        let template = self.env.get_template(NAME).map_err(template_error)?;
        template.render(ctx).map_err(template_error)
    }
}

/// `chat_template` in tokenizer_config.json: a string, or a list of named templates of which
/// transformers uses "default".
fn config_template(cfg: &Json, path: &Path) -> Result<Option<String>> {
    match &cfg["chat_template"] {
        Json::Null => Ok(None),
        Json::String(s) => Ok(Some(s.clone())),
        Json::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| {
                Error::config(
                    path,
                    "chat_template lists named templates but none called 'default'",
                )
            }),
        _ => Err(Error::config(
            path,
            "chat_template is neither a string nor a list",
        )),
    }
}

fn template_error(e: minijinja::Error) -> Error {
    // Display already ends with "(in chat_template:LINE)"; the cause (e.g. a failed filter)
    // is only in the source chain.
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let _ = write!(msg, ": {s}");
        source = s.source();
    }
    Error::Template(msg)
}

/// Prints none and booleans as Python does ("None", "True"), since templates were written
/// against jinja2.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut State,
    value: &Value,
) -> std::result::Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::None => out.write_str("None").map_err(minijinja::Error::from),
        ValueKind::Bool => out
            .write_str(if value.is_true() { "True" } else { "False" })
            .map_err(minijinja::Error::from),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            charge_items(state, value, 0)?;
            minijinja::escape_formatter(out, state, value)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Fuel per item of a printed list or map (see [`charge_items`]).
const ITEM_FUEL: u64 = 8;

/// Charges a render [`ITEM_FUEL`] per item of a list or map about to be printed, nested ones
/// included, before any is visited: minijinja charges printed text once it is built, and a list
/// repeated by `*` stays lazy until then (`{{ tools * 800001 }}` took 2 s to print, found by
/// fuzzing). Visiting and printing an item costs about as much as a few instructions do, so the
/// whole budget prints ~500 000 items (~0.2 s).
fn charge_items(state: &State, v: &Value, depth: usize) -> std::result::Result<(), minijinja::Error> {
    // Deeper than any printable structure a chat template builds; minijinja's own printing
    // recurses per level too.
    const MAX_DEPTH: usize = 256;
    if depth > MAX_DEPTH {
        return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "value nested too deep to print"));
    }
    let nested = |x: &Value| matches!(x.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::Iterable);
    let len = v.len();
    if let Some(n) = len {
        state.consume_fuel((n as u64).saturating_mul(ITEM_FUEL))?;
    }
    let is_map = v.kind() == ValueKind::Map;
    for item in v.try_iter()? {
        if len.is_none() {
            state.consume_fuel(ITEM_FUEL)?;
        }
        let item = if is_map { v.get_item(&item)? } else { item };
        if nested(&item) {
            charge_items(state, &item, depth + 1)?;
        }
    }
    Ok(())
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, ...)` with the same
/// parameter order (ensure_ascii, indent, separators, sort_keys). minijinja's own filter differs:
/// compact separators and HTML-escaped `<`, `>`, `&` and `'`, which would change tool schemas in
/// the prompt.
fn tojson(
    state: &State,
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii = ensure_ascii
        .or(kwargs.get("ensure_ascii")?)
        .is_some_and(|v| v.is_true());
    let indent = match indent.or(kwargs.get("indent")?) {
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => {
                let width = usize::try_from(v)?;
                charge(state, width)?;
                " ".repeat(width)
            }
        }),
        None => None,
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) if seps.len() == 2 => (seps[0].clone(), seps[1].clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ))
        }
        // Python drops the space after commas when indenting, since a newline follows.
        None => (
            if indent.is_some() { "," } else { ", " }.to_owned(),
            ": ".to_owned(),
        ),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let mut json = PyJson {
        state,
        charged: 0,
        out: String::new(),
        indent,
        item_sep,
        key_sep,
        sort_keys,
        ensure_ascii,
    };
    json.value(value, 0)?;
    Ok(Value::from_safe_string(json.out))
}

/// Charges a render's fuel for `bytes` of data a filter creates, at minijinja's own rate (one
/// fuel per 64 bytes), so that a template's memory stays bounded by its fuel: minijinja charges a
/// custom filter only for the value it returns, once it has been built.
fn charge(state: &State, bytes: usize) -> std::result::Result<(), minijinja::Error> {
    state.consume_fuel(bytes as u64 / 64)
}

/// A writer for `json.dumps` output: the same separators, indentation and number formats.
struct PyJson<'s, 't, 'e> {
    /// The render, charged for the output as it grows (`tojson(indent=10**9)` on a deep value
    /// must run out of fuel, not out of memory).
    state: &'s State<'t, 'e>,
    /// Bytes of `out` already charged.
    charged: usize,
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson<'_, '_, '_> {
    fn value(&mut self, v: &Value, depth: usize) -> std::result::Result<(), minijinja::Error> {
        match v.kind() {
            // jinja2's Undefined is not serializable; null is the forgiving reading.
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => self.out.push_str(&v.to_string()),
            ValueKind::Number => self.out.push_str(&python_float(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.container(depth, '{', '}', keys.into_iter(), |this, k, depth| {
                    match k.as_str() {
                        Some(s) => this.string(s),
                        None => this.string(&json_key(&k)?),
                    }
                    this.out.push_str(&this.key_sep);
                    this.value(&v.get_item(&k)?, depth)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(depth, '[', ']', items.into_iter(), |this, item, depth| {
                    this.value(&item, depth)
                })?;
            }
            _ => return Err(not_serializable(v)),
        }
        Ok(())
    }

    fn container<T>(
        &mut self,
        depth: usize,
        open: char,
        close: char,
        items: impl Iterator<Item = T>,
        mut write: impl FnMut(&mut Self, T, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        self.out.push(open);
        let mut empty = true;
        for (i, item) in items.enumerate() {
            if i > 0 {
                self.out.push_str(&self.item_sep);
            }
            self.newline(depth + 1)?;
            write(self, item, depth + 1)?;
            // Whole 64-byte units only, so that small items add up.
            let grown = (self.out.len() - self.charged) / 64 * 64;
            charge(self.state, grown)?;
            self.charged += grown;
            empty = false;
        }
        // Python writes empty containers as [] and {} even when indenting.
        if !empty {
            self.newline(depth)?;
        }
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) -> std::result::Result<(), minijinja::Error> {
        if let Some(indent) = &self.indent {
            let width = indent.len().saturating_mul(depth);
            charge(self.state, width)?;
            self.charged += width;
            self.out.push('\n');
            self.out.push_str(&indent.repeat(depth));
        }
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if c < ' ' || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python turns number, boolean and None keys into strings.
fn json_key(k: &Value) -> std::result::Result<String, minijinja::Error> {
    Ok(match k.kind() {
        ValueKind::None => "null".into(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number if k.is_integer() => k.to_string(),
        ValueKind::Number => python_float(f64::try_from(k.clone())?),
        _ => return Err(not_serializable(k)),
    })
}

fn not_serializable(v: &Value) -> minijinja::Error {
    minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("cannot serialize {} to JSON", v.kind()),
    )
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside [1e-4, 1e16) with
/// a signed, two-digit exponent.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let abs = f.abs();
    if abs == 0.0 || (1e-4..1e16).contains(&abs) {
        // Debug keeps the ".0" that Display drops and never switches to exponent form here.
        return format!("{f:?}");
    }
    let s = format!("{f:e}");
    let (mantissa, exp) = s.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    format!(
        "{mantissa}e{}{:02}",
        if exp < 0 { '-' } else { '+' },
        exp.abs()
    )
}

/// transformers' `strftime_now`: the current time through a strftime format. This uses UTC,
/// where transformers uses the machine's local time zone.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

/// The strftime conversions chat templates use, for a UTC timestamp; others are copied as is.
fn strftime(format: &str, unix_secs: u64) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let (year, month, day) = civil_from_days(days);
    let weekday = DAYS[(days + 3).rem_euclid(7) as usize]; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[month as usize - 1];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year % 100),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{weekday}"),
            Some('a') => write!(out, "{}", &weekday[..3]),
            Some('F') => write!(out, "{year}-{month:02}-{day:02}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
