//! The WebSocket subprotocols of `GET /v1/ws` (`Sec-WebSocket-Protocol`, RFC 6455
//! §1.9): `inferd.v1`, the protocol itself, and `inferd.key.<base64url(key)>`, the API
//! key for clients that cannot send an `Authorization` header (browsers' `WebSocket`
//! API). Pure parsing; the key is compared in [`super::http`].

use hyper::header::HeaderValue;

/// The subprotocol the server answers with whenever the client offers subprotocols.
pub const PROTOCOL: &str = "inferd.v1";

/// The prefix of the subprotocol that carries the API key, base64url without padding.
pub const KEY_PREFIX: &str = "inferd.key.";

/// What a client offered in its `Sec-WebSocket-Protocol` headers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Offer {
    /// Any subprotocol at all was offered (then the answer must name one of them).
    pub any: bool,
    /// `inferd.v1` was among them.
    pub v1: bool,
    /// The first `inferd.key.` entry: `Some(bytes)` when it decodes, `Some(empty)`
    /// never matches a key (an entry that is not base64url counts as a wrong key).
    /// Only the first entry counts, so one request cannot try many keys.
    pub key: Option<Vec<u8>>,
}

/// Reads every `Sec-WebSocket-Protocol` header value (each a comma-separated list).
pub fn parse<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> Offer {
    let mut offer = Offer::default();
    for entry in entries(values) {
        offer.any = true;
        if entry == PROTOCOL {
            offer.v1 = true;
        } else if let Some(encoded) = entry.strip_prefix(KEY_PREFIX) {
            if offer.key.is_none() {
                offer.key = Some(decode_base64url(encoded).unwrap_or_default());
            }
        }
    }
    offer
}

/// The entries of every `Sec-WebSocket-Protocol` header value, trimmed, empty ones
/// dropped; a value that is not visible ASCII offers nothing.
fn entries<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> impl Iterator<Item = &'a str> {
    values
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The offered subprotocols as an error message may show them back: the [`parse`]d
/// entries, comma-separated, with the key of an `inferd.key.` entry left out
/// (`inferd.key.…`).
pub fn offered_redacted<'a>(values: impl IntoIterator<Item = &'a HeaderValue>) -> String {
    entries(values)
        .map(|t| {
            if t.starts_with(KEY_PREFIX) {
                format!("{KEY_PREFIX}…")
            } else {
                t.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decodes base64url (RFC 4648 §5) without padding, canonical only (the unused low
/// bits of the last character zero); `None` for any other character, padding included,
/// or an impossible length.
pub fn decode_base64url(s: &str) -> Option<Vec<u8>> {
    data_encoding::BASE64URL_NOPAD.decode(s.as_bytes()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(values: &[&str]) -> Offer {
        let headers: Vec<HeaderValue> = values
            .iter()
            .map(|v| HeaderValue::from_str(v).expect("header"))
            .collect();
        parse(&headers)
    }

    #[test]
    fn base64url_round_trips_known_vectors() {
        // RFC 4648 §10, with the URL-safe alphabet and no padding.
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(decode_base64url(enc).as_deref(), Some(plain.as_bytes()));
        }
        // 0xfb 0xff: '+' and '/' in standard base64, '-' and '_' here.
        assert_eq!(decode_base64url("-_8").as_deref(), Some(&[0xfb, 0xff][..]));
        assert_eq!(decode_base64url("+/8"), None);
        assert_eq!(decode_base64url("Zg=="), None, "padding is refused");
        assert_eq!(decode_base64url("Z"), None, "impossible length");
        assert_eq!(decode_base64url("Zh"), None, "non-zero spare bits");
        assert_eq!(decode_base64url("Zm 9"), None);
    }

    #[test]
    fn the_offer_lists_v1_and_the_first_key() {
        // "test-key-0123" → dGVzdC1rZXktMDEyMw
        let o = offer(&["inferd.v1, inferd.key.dGVzdC1rZXktMDEyMw"]);
        assert_eq!(
            o,
            Offer {
                any: true,
                v1: true,
                key: Some(b"test-key-0123".to_vec())
            }
        );
        // Several headers, spaces, a second key entry ignored.
        let o = offer(&["chat", " inferd.key.YQ ,inferd.key.Yg", "inferd.v1"]);
        assert!(o.any && o.v1);
        assert_eq!(o.key.as_deref(), Some(&b"a"[..]));
        // Nothing offered.
        assert_eq!(offer(&[]), Offer::default());
        assert_eq!(offer(&[" , "]), Offer::default());
        // Other protocols only.
        let o = offer(&["chat, superchat"]);
        assert!(o.any && !o.v1 && o.key.is_none());
        // A key that is not base64url is kept as an empty key (never matches).
        let o = offer(&["inferd.v1, inferd.key.a+b"]);
        assert_eq!(o.key.as_deref(), Some(&b""[..]));
        // The match is exact: no case folding, no prefix match.
        let o = offer(&["Inferd.V1, inferd.v10"]);
        assert!(o.any && !o.v1);
    }

    #[test]
    fn the_offer_is_shown_back_without_the_key() {
        let shown = |values: &[&str]| {
            let headers: Vec<HeaderValue> = values
                .iter()
                .map(|v| HeaderValue::from_str(v).expect("header"))
                .collect();
            offered_redacted(&headers)
        };
        assert_eq!(shown(&["chat, superchat"]), "chat, superchat");
        assert_eq!(
            shown(&[" chat ,inferd.key.dGVzdC1rZXktMDEyMw", "inferd.v2"]),
            "chat, inferd.key.…, inferd.v2"
        );
        assert_eq!(shown(&[" , "]), "");
    }
}
