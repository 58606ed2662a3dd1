//! Any text as a chat template, compiled and rendered over a conversation with a system prompt,
//! tools and several turns: a template is a model file's code, so an endless loop must end with
//! TEMPLATE_ERROR (minijinja's fuel) and deep recursion with its recursion limit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlx_bun::tokenizer::template::{ChatTemplate, RenderOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else { return };
    let Ok(t) = ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into())) else { return };
    let messages = serde_json::json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
        {"role": "tool", "content": "4"},
        {"role": "user", "content": "Thanks"}
    ]);
    let opts = RenderOptions {
        tools: Some(serde_json::json!([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])),
        ..Default::default()
    };
    let _ = t.render(&messages, &opts);
});
