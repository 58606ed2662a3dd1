//! `tool_choice` that forces a call (OpenAI's `required` or a named function, Anthropic's `any`
//! or `tool`): the reply is decoded under a grammar that admits only tool calls in the format
//! the chat template teaches, with arguments valid against the tool's `parameters` schema. The
//! call is then parsed back as any call the model writes (`channels`).
use serde_json::{json, Value as Json};

use super::channels::ToolFormat;
use super::error::ApiError;
use crate::sample::grammar::GrammarSpec;

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    /// At least one call, of any tool.
    Required,
    /// One call of this tool.
    Named(String),
}

impl ToolChoice {
    /// OpenAI: `"auto" | "none" | "required" | {"type": "function", "function": {"name"}}`.
    pub fn openai(v: Option<&Json>) -> Result<Self, ApiError> {
        let bad = || ApiError::param("tool_choice", "must be 'auto', 'none', 'required' or {type: 'function', function: {name}}");
        match v {
            None | Some(Json::Null) => Ok(ToolChoice::Auto),
            Some(Json::String(s)) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                _ => Err(bad()),
            },
            Some(o) if o.get("type").and_then(Json::as_str) == Some("function") => {
                o.pointer("/function/name").and_then(Json::as_str).map(|n| ToolChoice::Named(n.to_owned())).ok_or_else(bad)
            }
            Some(_) => Err(bad()),
        }
    }

    /// Anthropic: `{"type": "auto" | "none" | "any" | "tool", "name"}`.
    pub fn anthropic(v: Option<&Json>) -> Result<Self, ApiError> {
        let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(ToolChoice::Auto) };
        match (v.get("type").and_then(Json::as_str), v.get("name").and_then(Json::as_str)) {
            (Some("auto"), _) => Ok(ToolChoice::Auto),
            (Some("none"), _) => Ok(ToolChoice::None),
            (Some("any"), _) => Ok(ToolChoice::Required),
            (Some("tool"), Some(name)) => Ok(ToolChoice::Named(name.to_owned())),
            _ => Err(ApiError::param("tool_choice", "must be {type: 'auto' | 'none' | 'any'} or {type: 'tool', name}")),
        }
    }

    /// Tools the template renders under this choice.
    pub fn tools(&self, tools: Option<Vec<Json>>) -> Option<Vec<Json>> {
        if *self == ToolChoice::None {
            None
        } else {
            tools
        }
    }
}

/// The grammar of the forced reply, for `tools` in OpenAI's shape; `None` when nothing is
/// forced.
pub fn forced_calls(format: Option<ToolFormat>, tools: &[Json], choice: &ToolChoice) -> Result<Option<GrammarSpec>, ApiError> {
    let names: Vec<&str> = tools.iter().filter_map(|t| t.pointer("/function/name").and_then(Json::as_str)).collect();
    let chosen: Vec<&Json> = match choice {
        ToolChoice::Auto | ToolChoice::None => return Ok(None),
        _ if tools.is_empty() => return Err(ApiError::param("tool_choice", "forces a tool call, but the request has no tools")),
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => {
            let t = tools.iter().find(|t| t.pointer("/function/name").and_then(Json::as_str) == Some(name));
            vec![t.ok_or_else(|| ApiError::param("tool_choice", &format!("names '{name}', which is not among the tools ({})", names.join(", "))))?]
        }
    };
    let Some(format) = format else {
        return Err(ApiError::unsupported("tools", "the chat template renders no tools"));
    };
    // The arguments' key is the one the format uses; the model's whitespace inside the JSON is
    // bounded as for `response_format`.
    let key = match format {
        ToolFormat::Hermes => "arguments",
        ToolFormat::Llama3Json => "parameters",
    };
    let calls: Vec<Json> = chosen
        .iter()
        .map(|t| {
            let name = t.pointer("/function/name").cloned().unwrap_or(Json::Null);
            let mut params = t.pointer("/function/parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
            closed(&mut params);
            json!({"type": "object", "properties": {"name": {"const": name}, key: params}, "required": ["name", key], "additionalProperties": false})
        })
        .collect();
    let schema = json!({"anyOf": calls, "x-guidance": {"whitespace_pattern": crate::sample::grammar::JSON_WHITESPACE}});
    let grammar = match format {
        ToolFormat::Hermes => {
            let more = if *choice == ToolChoice::Required { "(NL call)*" } else { "" };
            GrammarSpec::Lark(format!("start: call {more}\ncall: \"<tool_call>\" NL body NL \"</tool_call>\"\nbody: %json {schema}\nNL: /\\n/\n"))
        }
        ToolFormat::Llama3Json => GrammarSpec::JsonSchema(schema),
    };
    // A tool's `parameters` schema that llguidance cannot compile is the client's error.
    grammar.check().map_err(|e| ApiError { param: Some("tools".into()), ..ApiError::from(e) })?;
    Ok(Some(grammar))
}

/// Objects with listed `properties` take no other keys unless the schema says so (as OpenAI's
/// strict mode): otherwise a small model keeps inventing keys until its token limit.
fn closed(schema: &mut Json) {
    let Json::Object(o) = schema else { return };
    if o.contains_key("properties") && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), Json::Bool(false));
    }
    // Subschemas: maps of them, lists of them, and single ones.
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Json::Object(m)) = o.get_mut(key) {
            m.values_mut().for_each(closed);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Json::Array(a)) = o.get_mut(key) {
            a.iter_mut().for_each(closed);
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(s) = o.get_mut(key) {
            closed(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Json> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ]
    }

    #[test]
    fn choices_parse_in_both_dialects() {
        assert_eq!(ToolChoice::openai(None).unwrap(), ToolChoice::Auto);
        assert_eq!(ToolChoice::openai(Some(&json!("required"))).unwrap(), ToolChoice::Required);
        assert_eq!(ToolChoice::openai(Some(&json!({"type": "function", "function": {"name": "now"}}))).unwrap(), ToolChoice::Named("now".into()));
        assert!(ToolChoice::openai(Some(&json!("any"))).is_err());
        assert_eq!(ToolChoice::anthropic(Some(&json!({"type": "any"}))).unwrap(), ToolChoice::Required);
        assert_eq!(ToolChoice::anthropic(Some(&json!({"type": "tool", "name": "now"}))).unwrap(), ToolChoice::Named("now".into()));
        assert!(ToolChoice::anthropic(Some(&json!({"type": "tool"}))).is_err());
    }

    #[test]
    fn forced_calls_compile_for_each_format_and_refuse_what_cannot_be_forced() {
        for format in [ToolFormat::Hermes, ToolFormat::Llama3Json] {
            for choice in [ToolChoice::Required, ToolChoice::Named("get_weather".into())] {
                let g = forced_calls(Some(format), &tools(), &choice).unwrap().expect("a grammar");
                g.check().unwrap_or_else(|e| panic!("{format:?} {choice:?}: {e}"));
            }
        }
        assert!(forced_calls(Some(ToolFormat::Hermes), &tools(), &ToolChoice::Auto).unwrap().is_none());
        assert!(forced_calls(Some(ToolFormat::Hermes), &tools(), &ToolChoice::Named("nope".into())).is_err());
        assert!(forced_calls(Some(ToolFormat::Hermes), &[], &ToolChoice::Required).is_err());
        assert!(forced_calls(None, &tools(), &ToolChoice::Required).is_err());
        let mut s = json!({"type": "object", "properties": {"properties": {"type": "object", "properties": {}}, "b": {"properties": {}, "additionalProperties": true}, "c": {"items": {"anyOf": [{"properties": {}}]}}}});
        closed(&mut s);
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["properties"]["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["b"]["additionalProperties"], json!(true));
        assert_eq!(s["properties"]["c"]["items"]["anyOf"][0]["additionalProperties"], json!(false));
        assert_eq!(s["properties"].as_object().unwrap().len(), 3, "a property named 'properties' is a property");
    }
}
