//! Chat prompts as both APIs build them: messages checked and flattened for the chat template,
//! the request's tools rendered in (and the format the model will answer in), the rendered text
//! tokenized, and the splitter that will part the answer into content, reasoning and calls.
use serde_json::{Map, Value as Json_};

use super::channels::{thinks, Channels, ToolFormat};
use super::context::ServerContext;
use super::error::ApiError;
use super::tool_choice::{forced_calls, ToolChoice};
use crate::engine::fill::{template, FillPlan};
use crate::sample::grammar::GrammarSpec;
use crate::tokenizer::template::RenderOptions;

pub struct ChatPrompt {
    pub ids: Vec<u32>,
    pub channels: Channels,
    /// The grammar a forcing `tool_choice` decodes the reply under.
    pub forced: Option<GrammarSpec>,
    /// Strict fill rows of the template's tool calls, when the server fills.
    pub fill: FillPlan,
}

/// Renders OpenAI-shaped `messages` (see `template_messages`) with `tools` (OpenAI's
/// `{type: "function", function}` objects, or none) and further template variables; with
/// `fill`, compiles the strict rows of its tool calls.
pub fn chat_prompt(ctx: &ServerContext, messages: Vec<Json_>, tools: Option<Vec<Json_>>, choice: &ToolChoice, extra: Map<String, Json_>, fill: bool) -> Result<ChatPrompt, ApiError> {
    let template = ctx.template.as_ref().ok_or_else(|| ApiError::bad_request(format!("{} has no chat template; use /v1/completions", ctx.id)))?;
    let tools = choice.tools(tools);
    let forced_format = tools.as_ref().and_then(|_| ToolFormat::detect(template.source()));
    let forced = forced_calls(forced_format, tools.as_deref().unwrap_or_default(), choice)?;
    let tools = tools.filter(|t| !t.is_empty());
    let format = match &tools {
        None => None,
        Some(_) => Some(ToolFormat::detect(template.source()).ok_or_else(|| ApiError::unsupported("tools", &format!("the chat template of {} renders no tools", ctx.id)))?),
    };
    let messages = template_messages(messages)?;
    let fill = match (&tools, &messages, fill && forced.is_none()) {
        (Some(tools), Json_::Array(list), true) => template::compile(template, &ctx.tokenizer, list, tools, &extra),
        _ => FillPlan::default(),
    };
    let render = RenderOptions { tools: tools.map(Json_::Array), extra, ..Default::default() };
    let text = template.render(&messages, &render)?;
    let ids = ctx.tokenizer.encode(&text, false)?;
    // Templates that open the reasoning themselves leave the answer inside it.
    let channels = Channels::new(format, thinks(template.source()), text.trim_end().ends_with("<think>"));
    Ok(ChatPrompt { ids, channels, forced, fill })
}

/// The text of a message's `content`: a string, or the text parts of a list (joined, as
/// mlx-lm's server does); anything else (images, audio) is refused.
pub fn text_content(content: &Json_, param: &str) -> Result<String, ApiError> {
    match content {
        Json_::Null => Ok(String::new()),
        Json_::String(s) => Ok(s.clone()),
        Json_::Array(parts) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Json_::as_str), p.get("text").and_then(Json_::as_str)) {
                (Some("text"), Some(t)) => Ok(t),
                (Some(other), _) if other != "text" => Err(ApiError::unsupported(&format!("{param}[].type={other}"), "only text content is served")),
                _ => Err(ApiError::param(param, "each part must be {type: \"text\", text}")),
            })
            .collect(),
        _ => Err(ApiError::param(param, "must be a string or a list of content parts")),
    }
}

/// Messages as the chat template takes them: roles checked, content flattened to text, other
/// keys passed through (as transformers passes them).
pub fn template_messages(messages: Vec<Json_>) -> Result<Json_, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "must not be empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let Json_::Object(mut m) = m else { return Err(ApiError::param(&format!("messages[{i}]"), "must be an object")) };
        let role = match m.get("role").and_then(Json_::as_str) {
            Some("developer") => "system".to_string(),
            Some(r @ ("system" | "user" | "assistant" | "tool")) => r.to_string(),
            Some(r) => return Err(ApiError::param(&format!("messages[{i}].role"), format!("unknown role '{r}'"))),
            None => return Err(ApiError::param(&format!("messages[{i}].role"), "is required")),
        };
        // Templates write a call's arguments with `tojson`: they take the object, not its text.
        if let Some(Json_::Array(calls)) = m.get_mut("tool_calls") {
            for call in calls {
                if let Some(args) = call.pointer_mut("/function/arguments") {
                    if let Some(parsed) = args.as_str().and_then(|a| serde_json::from_str::<Json_>(a).ok()) {
                        *args = parsed;
                    }
                }
            }
        }
        let content = text_content(m.get("content").unwrap_or(&Json_::Null), &format!("messages[{i}].content"))?;
        m.insert("role".into(), role.into());
        m.insert("content".into(), content.into());
        out.push(Json_::Object(m));
    }
    Ok(Json_::Array(out))
}

