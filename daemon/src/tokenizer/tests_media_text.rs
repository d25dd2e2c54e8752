//! [`ContentParts::MediaText`]: messages reach a GGUF's template as llama-server gives
//! them (`common/chat.cpp`): one string with the media marker where each image was, or
//! one text part when the template shows only typed parts (LLaVA's reads only
//! `selectattr('type', 'equalto', 'text')`), for messages with and without images.

use std::path::PathBuf;

use super::{ChatTemplate, ContentParts, TemplateExtras};
use crate::request::{ChatMessage, ImageDetail, ImageInput, ImageSource};

const MARKER: &str = "<__media__>";

fn extras() -> TemplateExtras {
    TemplateExtras {
        content_parts: ContentParts::MediaText(MARKER.into()),
        ..TemplateExtras::default()
    }
}

fn with_image_at(text: &str, offset: usize) -> ChatMessage {
    let mut m = ChatMessage::new("user", text);
    m.images.push(ImageInput {
        at: "messages[0].content[0]".into(),
        offset,
        source: ImageSource::Data {
            media_type: "image/png".into(),
            base64: String::new(),
        },
        detail: ImageDetail::Auto,
    });
    m
}

fn render(t: &ChatTemplate, m: ChatMessage) -> String {
    t.render_marked(&[m], true, &extras()).expect("render").text
}

#[test]
fn a_typed_only_template_gets_one_text_part() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vlm/llava/chat_template.jinja");
    let source = std::fs::read_to_string(path).expect("template");
    let t = ChatTemplate::new(&source, "<s>", "</s>").expect("template");
    // llama-server's rendered prompts (daemon/tests/fixtures/vlm-gguf/llava/reference.json).
    assert_eq!(
        render(&t, with_image_at("Describe this image.", 0)),
        "USER: <__media__>Describe this image. ASSISTANT:"
    );
    assert_eq!(
        render(&t, ChatMessage::new("user", "Tell me about topic 3.")),
        "USER: Tell me about topic 3. ASSISTANT:"
    );
    // The marker is outside the message text: only the user's text is content.
    let r = t
        .render_marked(&[with_image_at("Hi", 0)], true, &extras())
        .expect("render");
    let spans: Vec<&str> = r.content_spans.iter().map(|s| &r.text[s.clone()]).collect();
    assert_eq!(spans, ["Hi"]);
}

#[test]
fn a_string_template_gets_the_joined_text() {
    let t = ChatTemplate::new(
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}",
        "",
        "",
    )
    .expect("template");
    assert_eq!(render(&t, with_image_at("ab", 1)), "[a<__media__>b]");
    assert_eq!(render(&t, ChatMessage::new("user", "plain")), "[plain]");
}
