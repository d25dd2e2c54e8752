//! Image parts of a chat message: `{"type": "image_url", "image_url": {"url": …,
//! "detail": …}}` (OpenAI's content part). Only `data:` URLs carry bytes; a `file:`
//! URL names a local file (read, in `prepare/`, only inside `media.local_dirs`); an
//! `http(s)` URL is refused: the daemon never fetches.

use serde_json::{Map, Value};

use super::{check_fields, quote, quote_str, VResult};
use crate::error::InferError;
use crate::request::{ImageDetail, ImageInput, ImageSource};

const IMAGE_URL_FIELDS: &[&str] = &["url", "detail"];

/// The image part `obj` at path `at`, sitting at byte `offset` of its message's text.
pub(super) fn parse_image_part(
    at: &str,
    offset: usize,
    obj: &Map<String, Value>,
) -> VResult<ImageInput> {
    let spec = match obj.get("image_url") {
        Some(Value::Object(o)) => o,
        None => {
            return Err(InferError::validation(format!(
                "{at} is missing field \"image_url\" ({{\"url\": \"data:image/png;base64,...\"}})"
            )))
        }
        Some(other) => {
            return Err(InferError::validation(format!(
                "{at}.image_url must be an object {{\"url\": ..., \"detail\": ...}} (got {})",
                quote(other)
            )))
        }
    };
    let here = format!("{at}.image_url");
    check_fields(spec, IMAGE_URL_FIELDS, &here)?;
    let url = match spec.get("url") {
        Some(Value::String(u)) => u,
        None => {
            return Err(InferError::validation(format!(
                "{here} is missing field \"url\""
            )))
        }
        Some(other) => {
            return Err(InferError::validation(format!(
                "{here}.url must be a string (got {})",
                quote(other)
            )))
        }
    };
    let detail = match spec.get("detail") {
        None | Some(Value::Null) => ImageDetail::Auto,
        Some(Value::String(d)) if d == "auto" => ImageDetail::Auto,
        Some(Value::String(d)) if d == "low" => ImageDetail::Low,
        Some(Value::String(d)) if d == "high" => ImageDetail::High,
        Some(other) => {
            return Err(InferError::validation(format!(
                "{here}.detail must be \"auto\", \"low\" or \"high\" (got {})",
                quote(other)
            )))
        }
    };
    Ok(ImageInput {
        at: at.to_owned(),
        offset,
        source: source(&format!("{here}.url"), url)?,
        detail,
    })
}

/// The source a URL names.
fn source(at: &str, url: &str) -> VResult<ImageSource> {
    let scheme = url
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    match scheme.as_str() {
        "data" => data_url(at, &url[5..]),
        "file" => file_url(at, &url[5..]),
        "http" | "https" => Err(InferError::validation(format!(
            "{at}: {scheme} URLs are not fetched (the daemon never loads anything from the \
             network); send the image as a data: URL (data:image/png;base64,...)"
        ))),
        _ => Err(InferError::validation(format!(
            "{at} must be a data: URL (data:image/png;base64,...) or a file: URL (got {})",
            quote_str(url)
        ))),
    }
}

/// `data:[<media type>][;base64],<data>` (RFC 2397), base64 only.
fn data_url(at: &str, rest: &str) -> VResult<ImageSource> {
    let Some((header, payload)) = rest.split_once(',') else {
        return Err(InferError::validation(format!(
            "{at}: a data: URL needs a comma before its data (data:image/png;base64,...)"
        )));
    };
    let Some(media_type) = header
        .len()
        .checked_sub(7)
        .filter(|&n| header.is_char_boundary(n) && header[n..].eq_ignore_ascii_case(";base64"))
        .map(|n| &header[..n])
    else {
        return Err(InferError::validation(format!(
            "{at}: a data: URL must be base64-encoded (data:image/png;base64,...; got data:{})",
            quote_str(header)
        )));
    };
    // Parameters (`;charset=…`) may sit between the type and `;base64`.
    let media_type = media_type.split(';').next().unwrap_or_default().trim();
    if !media_type.is_empty() && !media_type.to_ascii_lowercase().starts_with("image/") {
        return Err(InferError::validation(format!(
            "{at}: the data: URL's media type must be image/* (got {})",
            quote_str(media_type)
        )));
    }
    if payload.trim().is_empty() {
        return Err(InferError::validation(format!(
            "{at}: the data: URL holds no data"
        )));
    }
    Ok(ImageSource::Data {
        media_type: media_type.to_ascii_lowercase(),
        base64: payload.to_owned(),
    })
}

/// `file:///abs/path` or `file:/abs/path` (RFC 8089, local host only), percent-decoded.
fn file_url(at: &str, rest: &str) -> VResult<ImageSource> {
    let path = match rest.strip_prefix("//") {
        Some(r) => r.strip_prefix("localhost").unwrap_or(r),
        None => rest,
    };
    if path.contains(['?', '#']) {
        return Err(InferError::validation(format!(
            "{at}: a file: URL must not have a query or fragment (escape ? and # as %3F and \
             %23; got {})",
            quote_str(&format!("file:{rest}"))
        )));
    }
    if !path.starts_with('/') {
        return Err(InferError::validation(format!(
            "{at}: a file: URL must name an absolute local path (file:///dir/image.png; got {})",
            quote_str(&format!("file:{rest}"))
        )));
    }
    let decoded = percent_decode(path).ok_or_else(|| {
        InferError::validation(format!(
            "{at}: the file: URL's path is not valid percent-encoded UTF-8 (got {})",
            quote_str(path)
        ))
    })?;
    Ok(ImageSource::File(decoded.into()))
}

/// `%XX` escapes decoded; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn part(v: Value) -> VResult<ImageInput> {
        let Value::Object(o) = v else {
            panic!("object")
        };
        parse_image_part("messages[0].content[1]", 3, &o)
    }

    fn err(v: Value) -> String {
        part(v).expect_err("refused").message
    }

    #[test]
    fn a_data_url_keeps_its_type_and_payload() {
        let p = part(json!({"type": "image_url",
                            "image_url": {"url": "data:image/PNG;base64,iVBORw0K", "detail": "low"}}))
        .expect("valid");
        assert_eq!(p.at, "messages[0].content[1]");
        assert_eq!(p.offset, 3);
        assert_eq!(p.detail, ImageDetail::Low);
        assert_eq!(
            p.source,
            ImageSource::Data {
                media_type: "image/png".into(),
                base64: "iVBORw0K".into()
            }
        );
    }

    #[test]
    fn a_file_url_is_percent_decoded() {
        let p =
            part(json!({"type": "image_url", "image_url": {"url": "file:///srv/img/a%20b.png"}}))
                .expect("valid");
        assert_eq!(p.source, ImageSource::File("/srv/img/a b.png".into()));
        let p =
            part(json!({"type": "image_url", "image_url": {"url": "file:/x.png"}})).expect("valid");
        assert_eq!(p.source, ImageSource::File("/x.png".into()));
    }

    #[test]
    fn bad_parts_name_the_field() {
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}})),
            "messages[0].content[1].image_url.url: https URLs are not fetched (the daemon never \
             loads anything from the network); send the image as a data: URL \
             (data:image/png;base64,...)"
        );
        assert_eq!(
            err(json!({"type": "image_url"})),
            "messages[0].content[1] is missing field \"image_url\" ({\"url\": \
             \"data:image/png;base64,...\"})"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": "data:image/png;base64,AA"})),
            "messages[0].content[1].image_url must be an object {\"url\": ..., \"detail\": ...} \
             (got \"data:image/png;base64,AA\")"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "data:image/png,AAAA"}})),
            "messages[0].content[1].image_url.url: a data: URL must be base64-encoded \
             (data:image/png;base64,...; got data:\"image/png\")"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "data:text/plain;base64,AAAA"}})),
            "messages[0].content[1].image_url.url: the data: URL's media type must be image/* \
             (got \"text/plain\")"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,"}})),
            "messages[0].content[1].image_url.url: the data: URL holds no data"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "file:relative.png"}})),
            "messages[0].content[1].image_url.url: a file: URL must name an absolute local path \
             (file:///dir/image.png; got \"file:relative.png\")"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "file:///a/b.png?x=1"}})),
            "messages[0].content[1].image_url.url: a file: URL must not have a query or fragment \
             (escape ? and # as %3F and %23; got \"file:///a/b.png?x=1\")"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "ftp://h/x.png"}})),
            "messages[0].content[1].image_url.url must be a data: URL \
             (data:image/png;base64,...) or a file: URL (got \"ftp://h/x.png\")"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "data:,A", "detail": "max"}})),
            "messages[0].content[1].image_url.detail must be \"auto\", \"low\" or \"high\" \
             (got \"max\")"
        );
        assert_eq!(
            err(json!({"type": "image_url", "image_url": {"url": "data:,A", "size": 1}})),
            "unknown field \"size\" in messages[0].content[1].image_url (allowed: url, detail)"
        );
    }
}
