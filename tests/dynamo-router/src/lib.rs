//! See tests/router.rs.
