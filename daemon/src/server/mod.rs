//! The network edge: the TCP listener and one WebSocket session per connection.
//! No inference logic lives here: sessions parse frames through `api`, hand requests
//! to the tokenizer stage and forward each request's events back as frames.

mod session;

pub use session::{serve, Engine};
