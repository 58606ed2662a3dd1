//! The model's text split into what the APIs report apart: reasoning (`<think>…</think>`, as
//! `reasoning_content`), tool calls (as `tool_calls`) and the answer itself. Markers may arrive
//! split over tokens, so text that could begin one is held back until it is known (as stop
//! strings are). Each chat-template family writes tool calls its own way:
//! - ChatML / Qwen / Hermes: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number;
//! - Llama 3: the whole answer is one JSON object `{"name": …, "parameters": {…}}` (after an
//!   optional `<|python_tag|>`), or several separated by `;`.
use serde_json::Value as Json;

use super::stop::partial_suffix;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
}

impl ToolFormat {
    /// The format a chat template teaches its model, if it renders tools at all.
    pub fn detect(template: &str) -> Option<Self> {
        if !template.contains("tools") {
            None
        } else if template.contains(CALL_OPEN) {
            Some(ToolFormat::Hermes)
        } else if template.contains("<|start_header_id|>") {
            Some(ToolFormat::Llama3Json)
        } else {
            None
        }
    }
}

/// Whether a template's model thinks in `<think>` tags.
pub fn thinks(template: &str) -> bool {
    template.contains(THINK_OPEN)
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// What a piece of model text adds to each channel.
#[derive(Debug, Default, PartialEq)]
pub struct Split {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
}

impl Split {
    /// Adds what a later piece of the same text gave.
    pub fn append(&mut self, later: Split) {
        self.content += &later.content;
        self.reasoning += &later.reasoning;
        self.calls.extend(later.calls);
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Content,
    Reasoning,
    Call,
    /// Llama 3: the answer began as JSON; it is read whole at the end.
    Json,
}

pub struct Channels {
    tools: Option<ToolFormat>,
    think: bool,
    state: State,
    held: String,
    /// Nothing but whitespace has been emitted as content yet.
    at_start: bool,
}

impl Channels {
    /// `tools`: the request's tools are in the prompt, in this format. `think`: the model may
    /// reason in `<think>` tags; `thinking_open`: the prompt already opened one.
    pub fn new(tools: Option<ToolFormat>, think: bool, thinking_open: bool) -> Self {
        let state = if think && thinking_open { State::Reasoning } else { State::Content };
        Channels { tools, think, state, held: String::new(), at_start: true }
    }

    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Json => return out,
                State::Reasoning => match self.held.find(THINK_CLOSE) {
                    Some(at) => {
                        out.reasoning += &self.held[..at];
                        self.held.drain(..at + THINK_CLOSE.len());
                        self.state = State::Content;
                    }
                    None => {
                        out.reasoning += &self.release(&[THINK_CLOSE]);
                        return out;
                    }
                },
                State::Call => match self.held.find(CALL_CLOSE) {
                    Some(at) => {
                        let body = self.held[..at].to_string();
                        self.held.drain(..at + CALL_CLOSE.len());
                        match parse_call(&body) {
                            Some(call) => out.calls.push(call),
                            // Not a call after all: the text is the model's, so it is kept.
                            None => out.content += &format!("{CALL_OPEN}{body}{CALL_CLOSE}"),
                        }
                        self.state = State::Content;
                    }
                    None => return out,
                },
                State::Content => {
                    if self.at_start && self.tools == Some(ToolFormat::Llama3Json) {
                        let t = self.held.trim_start();
                        if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                            self.state = State::Json;
                            continue;
                        }
                        if t.is_empty() || PYTHON_TAG.starts_with(t) {
                            return out;
                        }
                    }
                    // Reasoning opens the answer or not at all: a tag later on is text.
                    if self.think && self.at_start {
                        let t = self.held.trim_start();
                        if t.starts_with(THINK_OPEN) {
                            let at = self.held.len() - t.len();
                            self.held.drain(..at + THINK_OPEN.len());
                            self.state = State::Reasoning;
                            continue;
                        }
                        if THINK_OPEN.starts_with(t) {
                            return out;
                        }
                    }
                    let markers: &[&str] = if self.tools == Some(ToolFormat::Hermes) { &[CALL_OPEN] } else { &[] };
                    match self.held.find(CALL_OPEN).filter(|_| !markers.is_empty()) {
                        Some(at) => {
                            let before = self.held[..at].to_string();
                            self.emit(&mut out, &before);
                            self.held.drain(..at + CALL_OPEN.len());
                            self.state = State::Call;
                        }
                        None => {
                            let text = self.release(markers);
                            self.emit(&mut out, &text);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// A whole answer at once: `push` then `finish`.
    pub fn whole(mut self, text: &str) -> Split {
        let mut split = self.push(text);
        split.append(self.finish());
        split
    }

    /// The output ended: whatever is held goes to its channel (an unfinished or unparsable
    /// call as text, so nothing the model wrote is lost).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        let mut out = Split::default();
        match self.state {
            State::Reasoning => out.reasoning = held,
            State::Call => out.content = format!("{CALL_OPEN}{held}"),
            State::Json => match parse_json_calls(&held) {
                Some(calls) => out.calls = calls,
                None => out.content = held,
            },
            State::Content => out.content = held,
        }
        self.state = State::Content;
        out
    }

    fn emit(&mut self, out: &mut Split, text: &str) {
        if !text.trim().is_empty() {
            self.at_start = false;
        }
        out.content += text;
    }

    /// Takes the held text except a tail that could begin one of `markers`.
    fn release(&mut self, markers: &[&str]) -> String {
        let keep = partial_suffix(&self.held, markers.iter().copied());
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        text
    }
}

/// One call object: `name` and its `arguments` (or Llama's `parameters`), an object or its text.
fn call_from(v: &Json) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(Json::Object(Default::default()));
    let arguments = match args {
        Json::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

fn parse_call(body: &str) -> Option<ToolCall> {
    call_from(&serde_json::from_str(body.trim()).ok()?)
}

fn parse_json_calls(text: &str) -> Option<Vec<ToolCall>> {
    let text = text.trim_start().trim_start_matches(PYTHON_TAG);
    let calls: Option<Vec<ToolCall>> = text.split(';').filter(|s| !s.trim().is_empty()).map(parse_call).collect();
    calls.filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one and sums what each channel got.
    fn run(c: &mut Channels, pieces: &[&str]) -> Split {
        let mut all = Split::default();
        for p in pieces {
            all.append(c.push(p));
        }
        all.append(c.finish());
        all
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn hermes_calls_split_over_tokens() {
        let mut c = Channels::new(Some(ToolFormat::Hermes), false, false);
        let pieces = ["Let me check.", "<tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}\n</tool_", "call>", "<tool_call>{\"name\":\"now\"}</tool_call>"];
        let s = run(&mut c, &pieces);
        assert_eq!(s.content, "Let me check.");
        assert_eq!(s.calls, vec![call("get_weather", r#"{"city":"Paris"}"#), call("now", "{}")]);
    }

    #[test]
    fn text_that_only_looks_like_a_marker_is_kept() {
        let mut c = Channels::new(Some(ToolFormat::Hermes), false, false);
        assert_eq!(run(&mut c, &["a <tool", "box> b"]).content, "a <toolbox> b");
        let mut c = Channels::new(Some(ToolFormat::Hermes), false, false);
        let s = run(&mut c, &["<tool_call>not json</tool_call> and <tool_call>{\"name\""]);
        assert_eq!(s.content, "<tool_call>not json</tool_call> and <tool_call>{\"name\"");
        assert!(s.calls.is_empty());
        // Without tools in the prompt nothing is parsed.
        let mut c = Channels::new(None, false, false);
        assert_eq!(run(&mut c, &["<tool_call>{\"name\":\"x\"}</tool_call>"]).content, "<tool_call>{\"name\":\"x\"}</tool_call>");
    }

    #[test]
    fn llama3_json_answers() {
        let mut c = Channels::new(Some(ToolFormat::Llama3Json), false, false);
        let s = run(&mut c, &[" {\"name\": \"search\", ", "\"parameters\": {\"q\": \"mlx\"}}"]);
        assert_eq!((s.content.as_str(), s.calls), ("", vec![call("search", r#"{"q":"mlx"}"#)]));
        let mut c = Channels::new(Some(ToolFormat::Llama3Json), false, false);
        let s = run(&mut c, &["<|python", "_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}"]);
        assert_eq!(s.calls, vec![call("a", "{}"), call("b", r#"{"x":1}"#)]);
        let mut c = Channels::new(Some(ToolFormat::Llama3Json), false, false);
        assert_eq!(run(&mut c, &["Paris is {big}"]).content, "Paris is {big}");
        let mut c = Channels::new(Some(ToolFormat::Llama3Json), false, false);
        assert_eq!(run(&mut c, &["{not a call}"]).content, "{not a call}");
    }

    #[test]
    fn reasoning_is_split_from_the_answer() {
        let mut c = Channels::new(None, true, false);
        let s = run(&mut c, &["<thi", "nk>Paris is in Fr", "ance.</th", "ink>\n\nParis."]);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("Paris is in France.", "\n\nParis."));
        // The prompt opened the tag: the output starts inside it.
        let mut c = Channels::new(None, true, true);
        let s = run(&mut c, &["hmm</think>yes"]);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("hmm", "yes"));
        // A tag later in the answer is text.
        let mut c = Channels::new(None, true, false);
        assert_eq!(run(&mut c, &["I use <think> tags"]).content, "I use <think> tags");
        // Reasoning cut off by max_tokens stays reasoning.
        let mut c = Channels::new(Some(ToolFormat::Hermes), true, false);
        let s = run(&mut c, &["<think>let me", " see"]);
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("let me see", ""));
    }

    #[test]
    fn formats_are_told_by_their_templates() {
        assert_eq!(ToolFormat::detect("{% if tools %}<tool_call>{% endif %}"), Some(ToolFormat::Hermes));
        assert_eq!(ToolFormat::detect("{% if tools %}<|start_header_id|>ipython{% endif %}"), Some(ToolFormat::Llama3Json));
        assert_eq!(ToolFormat::detect("<|im_start|>{{ message.content }}"), None);
        assert!(thinks("{{ '<think>\\n' }}") && !thinks("<|im_start|>"));
    }
}
