//! The interactive session's conversation: the system prompt and the user and assistant
//! messages of the finished turns, all sent again with each new turn.

use serde_json::Value;

use crate::request::message;

/// A multi-turn chat history.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    system: Option<String>,
    /// `(user, assistant)` pairs of the finished turns, oldest first.
    turns: Vec<(String, String)>,
}

impl Conversation {
    /// An empty conversation with an optional system prompt.
    pub fn new(system: Option<String>) -> Self {
        Self {
            system,
            turns: Vec::new(),
        }
    }

    /// The system prompt.
    pub fn system(&self) -> Option<&str> {
        self.system.as_deref()
    }

    /// The messages for a new turn asking `question`: the system prompt, every finished
    /// turn, then the question.
    pub fn messages_for(&self, question: &str) -> Vec<Value> {
        let mut messages = Vec::with_capacity(2 * self.turns.len() + 2);
        if let Some(system) = &self.system {
            messages.push(message("system", system));
        }
        for (user, assistant) in &self.turns {
            messages.push(message("user", user));
            messages.push(message("assistant", assistant));
        }
        messages.push(message("user", question));
        messages
    }

    /// Records a finished turn. Cancelled and failed turns are not recorded, so the
    /// history always alternates user and complete assistant messages.
    pub fn push(&mut self, question: String, answer: String) {
        self.turns.push((question, answer));
    }

    /// Forgets every turn; the system prompt stays.
    pub fn reset(&mut self) {
        self.turns.clear();
    }

    /// Sets the system prompt and forgets every turn.
    pub fn set_system(&mut self, system: String) {
        self.system = Some(system);
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn turns_are_resent_in_order() {
        let mut c = Conversation::new(Some("Be brief.".into()));
        assert_eq!(
            c.messages_for("Hi"),
            [
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Hi"})
            ]
        );
        c.push("Hi".into(), "Hello!".into());
        assert_eq!(
            c.messages_for("And?"),
            [
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Hi"}),
                json!({"role": "assistant", "content": "Hello!"}),
                json!({"role": "user", "content": "And?"})
            ]
        );
    }

    #[test]
    fn reset_keeps_the_system_prompt_and_set_system_resets() {
        let mut c = Conversation::new(Some("S".into()));
        c.push("q".into(), "a".into());
        c.reset();
        assert_eq!(c.messages_for("x").len(), 2);
        assert_eq!(c.system(), Some("S"));
        c.push("q".into(), "a".into());
        c.set_system("T".into());
        assert_eq!(c.messages_for("x").len(), 2);
        assert_eq!(
            c.messages_for("x")[0],
            json!({"role": "system", "content": "T"})
        );
        let plain = Conversation::new(None);
        assert_eq!(
            plain.messages_for("x"),
            [json!({"role": "user", "content": "x"})]
        );
    }
}
