//! detokenizer
