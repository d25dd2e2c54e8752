use super::*;
use crate::request::tools::{fold_tool_calls, ToolCall};

/// Runs `pieces` through a parser; returns (content, calls folded, every delta).
fn run(
    format: ToolFormat,
    parallel: bool,
    pieces: &[&str],
) -> (String, Vec<ToolCall>, Vec<ToolCallDelta>) {
    let mut p = ToolCallParser::new(format, parallel, 7);
    let mut content = String::new();
    let mut deltas = Vec::new();
    for piece in pieces {
        let mut out = ToolSplit::default();
        p.push(piece, &mut out);
        content.push_str(&out.content);
        deltas.extend(out.calls);
    }
    let mut out = ToolSplit::default();
    p.finish(&mut out);
    content.push_str(&out.content);
    deltas.extend(out.calls);
    (content, fold_tool_calls(&deltas), deltas)
}

fn call(i: u32, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: format!("call_{:08x}00000007{i:08x}", process_salt()),
        name: name.into(),
        arguments: args.into(),
    }
}

const HERMES: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"}\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

#[test]
fn hermes_calls_at_every_split() {
    let want = vec![
        call(
            0,
            "get_weather",
            "{\"city\": \"Paris \\\"}\", \"days\": [1, 2]}",
        ),
        call(1, "get_time", "{}"),
    ];
    for a in 0..=HERMES.len() {
        for b in (a..=HERMES.len()).step_by(7) {
            let (content, calls, _) = run(
                ToolFormat::Hermes,
                true,
                &[&HERMES[..a], &HERMES[a..b], &HERMES[b..]],
            );
            assert_eq!(content, "Let me check.", "splits {a} {b}");
            assert_eq!(calls, want, "splits {a} {b}");
        }
    }
}

#[test]
fn arguments_stream_piece_by_piece() {
    let chars: Vec<String> = HERMES.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    let (_, calls, deltas) = run(ToolFormat::Hermes, true, &pieces);
    assert_eq!(calls.len(), 2);
    // Name once with the id, then one piece per character of the arguments.
    let first: Vec<&ToolCallDelta> = deltas.iter().filter(|d| d.index == 0).collect();
    assert_eq!(first[0].name.as_deref(), Some("get_weather"));
    assert_eq!(first[0].arguments, "");
    assert!(first[1..]
        .iter()
        .all(|d| d.id.is_none() && d.name.is_none()));
    assert_eq!(first.len() - 1, calls[0].arguments.chars().count());
}

#[test]
fn parallel_false_keeps_the_first_call() {
    let (content, calls, _) = run(ToolFormat::Hermes, false, &[HERMES]);
    assert_eq!(content, "Let me check.");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_weather");
}

#[test]
fn what_is_not_a_call_stays_content() {
    let text = "a <tool_call>not json</tool_call> b <tool_c";
    let (content, calls, _) = run(ToolFormat::Hermes, true, &[text]);
    assert!(calls.is_empty());
    assert_eq!(content, text);
    let (content, calls, _) = run(
        ToolFormat::Hermes,
        true,
        &["x <tool_call>{\"a\": 1}</tool_call>"],
    );
    assert!(calls.is_empty());
    assert_eq!(content, "x <tool_call>{\"a\": 1}</tool_call>");
    let (content, calls, _) = run(ToolFormat::Hermes, true, &["plain answer\n\n"]);
    assert!(calls.is_empty());
    assert_eq!(
        content, "plain answer\n\n",
        "trailing whitespace kept without calls"
    );
}

#[test]
fn other_key_orders_and_string_arguments_parse_whole() {
    let text = "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"x\\\": 2}\"}</tool_call>";
    for cut in 0..=text.len() {
        let (content, calls, _) = run(ToolFormat::Hermes, true, &[&text[..cut], &text[cut..]]);
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![call(0, "f", "{\"q\":1}"), call(1, "g", "{\"x\": 2}")],
            "cut {cut}"
        );
    }
}

#[test]
fn unfinished_call_keeps_its_streamed_arguments() {
    let (content, calls, _) = run(
        ToolFormat::Hermes,
        true,
        &["<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"b"],
    );
    assert_eq!(content, "");
    assert_eq!(calls, vec![call(0, "f", "{\"a\": \"b")]);
    let (content, calls, _) = run(ToolFormat::Hermes, true, &["<tool_call>\n{\"na"]);
    assert!(calls.is_empty());
    assert_eq!(content, "", "a call cut off before its name is not content");
    let (content, calls, _) = run(
        ToolFormat::Hermes,
        true,
        &["<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_"],
    );
    assert_eq!(
        (content.as_str(), calls.len()),
        ("", 1),
        "the next opener's prefix is dropped"
    );
}

#[test]
fn llama3_json_calls() {
    let text = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"parameters\": {}}";
    for cut in 0..=text.len() {
        let (content, calls, _) = run(ToolFormat::Llama3Json, true, &[&text[..cut], &text[cut..]]);
        assert_eq!(content, "", "cut {cut}");
        assert_eq!(
            calls,
            vec![call(0, "f", "{\"x\": 1}"), call(1, "g", "{}")],
            "cut {cut}"
        );
    }
    let (content, calls, _) = run(ToolFormat::Llama3Json, true, &["  The answer is {x}."]);
    assert!(calls.is_empty());
    assert_eq!(content, "  The answer is {x}.");
    let (content, calls, _) = run(ToolFormat::Llama3Json, true, &["{not a call}"]);
    assert!(calls.is_empty());
    assert_eq!(content, "{not a call}");
}

#[test]
fn mistral_v3_calls() {
    let text = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": [1]}}, {\"name\": \"g\", \"arguments\": {}}]";
    for cut in 0..=text.len() {
        let (content, calls, _) = run(ToolFormat::MistralV3, true, &[&text[..cut], &text[cut..]]);
        assert_eq!(content, "", "cut {cut}");
        assert_eq!(
            calls,
            vec![call(0, "f", "{\"x\": [1]}"), call(1, "g", "{}")],
            "cut {cut}"
        );
    }
}

#[test]
fn formats_come_from_the_template() {
    assert_eq!(
        ToolFormat::of_template("{% for t in tools %}<tool_call>{% endfor %}"),
        (ToolFormat::Hermes, true)
    );
    assert_eq!(
        ToolFormat::of_template("{{ '[TOOL_CALLS]' }}{% if tools %}{% endif %}"),
        (ToolFormat::MistralV3, true)
    );
    assert_eq!(
        ToolFormat::of_template("{% if tools %}<|python_tag|>ipython{% endif %}"),
        (ToolFormat::Llama3Json, true)
    );
    assert_eq!(
        ToolFormat::of_template("{{ messages[0].content }}"),
        (ToolFormat::Hermes, false)
    );
}
