//! The browser chat page (`GET /`, `docs/http-api.md#the-chat-page`): three static
//! files embedded in the binary, served without the API key (they hold no data; every
//! call the page makes carries the key the user enters), with a strict
//! Content-Security-Policy: the page loads nothing but these files and talks only to
//! its own origin (`connect-src 'self'` covers the same-origin `ws://` in current
//! browsers, CSP Level 3).

use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Response};

use super::http::{full, method_not_allowed, Body};

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const ASSETS: [Asset; 3] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("page/index.html"),
    },
    Asset {
        path: "/app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("page/app.js"),
    },
    Asset {
        path: "/style.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("page/style.css"),
    },
];

/// The page's Content-Security-Policy: its own scripts, styles and connections only;
/// no inline script or style, no plugins, no frames, no forms posted elsewhere.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                       img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
                       form-action 'none'; frame-ancestors 'none'";

/// Serves the page file at `path` (`GET`, `HEAD`; 405 otherwise); `None` when `path`
/// is not one of them.
pub fn serve(method: &Method, path: &str) -> Option<Response<Body>> {
    let asset = ASSETS.iter().find(|a| a.path == path)?;
    if method != Method::GET && method != Method::HEAD {
        return Some(method_not_allowed("GET, HEAD"));
    }
    let mut r = Response::new(full(asset.bytes));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_served_with_its_type_and_the_policy() {
        for (path, ty) in [
            ("/", "text/html"),
            ("/app.js", "text/javascript"),
            ("/style.css", "text/css"),
        ] {
            let r = serve(&Method::GET, path).expect("a page file");
            assert_eq!(r.status(), 200);
            let h = r.headers();
            assert!(h[header::CONTENT_TYPE]
                .to_str()
                .is_ok_and(|v| v.starts_with(ty)));
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP);
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(
                serve(&Method::HEAD, path).map(|r| r.status().as_u16()),
                Some(200)
            );
            let post = serve(&Method::POST, path).expect("405");
            assert_eq!(post.status(), 405);
            assert_eq!(post.headers()[header::ALLOW], "GET, HEAD");
        }
        for other in ["/index.html", "/v1/ws", "/nope", "/app.js/"] {
            assert!(serve(&Method::GET, other).is_none(), "{other}");
        }
    }

    #[test]
    fn the_page_loads_only_its_own_files() {
        let html = std::str::from_utf8(ASSETS[0].bytes).expect("utf-8");
        assert!(html.contains("src=\"app.js\"") && html.contains("href=\"style.css\""));
        // No inline script or style (the policy would block them) and nothing remote.
        assert!(!html.contains("<script>") && !html.contains("style=\""));
        for asset in &ASSETS {
            let text = std::str::from_utf8(asset.bytes).expect("utf-8");
            assert!(
                !text.contains("https://") && !text.contains("http://"),
                "{}",
                asset.path
            );
        }
    }
}
