//! [`Tokens`]: what a tenant is charged for one answer, counted from the
//! answer itself.

use axum::http::response::Parts;
use serde::Deserialize;
use tower_window::layer::{Usage, UsageCounter};

/// The longest event line counted; a longer one is skipped (counted as no
/// token) rather than buffered without bound.
const MAX_LINE: usize = 1 << 20;

/// Counts the completion tokens a client is sent: the tokens it pays for.
///
/// - A streamed answer (`text/event-stream`): one token per content delta
///   (`data: {"choices":[{"delta":{"content":"..."}}]}`) as its event
///   passes to the client, until the final event's `usage` object arrives:
///   its `completion_tokens` is the model's own count and replaces the
///   deltas counted (a model may put several tokens in one delta). A
///   stream that ends early (client gone, upstream failed, stalled, shut
///   down) is charged the deltas the client was sent.
/// - A JSON answer: the `completion_tokens` of its `usage`, which the
///   proxy reads before the answer leaves and puts in a [`Usage`]
///   extension.
///
/// Prompt tokens are not charged: a stream cut short has no `usage`
/// object, and the one rule "what the client was sent" keeps a complete
/// answer and a cut one consistent. Charge `total_tokens` instead where
/// prompts are what costs.
#[derive(Debug, Default)]
pub struct Tokens {
    /// The unfinished line of the stream (events may be split across
    /// frames).
    line: Vec<u8>,
    /// Skipping the rest of a line longer than [`MAX_LINE`].
    skipping: bool,
    deltas: u32,
    reported: Option<u32>,
}

impl Tokens {
    fn on_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let Ok(chunk) = serde_json::from_slice::<Chunk>(data.trim_ascii()) else {
            return; // `[DONE]`, an error event, or not JSON
        };
        let deltas = chunk
            .choices
            .iter()
            .filter(|c| c.delta.content.as_deref().is_some_and(|s| !s.is_empty()))
            .count();
        self.deltas = self
            .deltas
            .saturating_add(u32::try_from(deltas).unwrap_or(u32::MAX));
        if let Some(usage) = chunk.usage {
            self.reported = Some(usage.completion_tokens);
        }
    }
}

impl UsageCounter for Tokens {
    fn on_head(&mut self, head: &Parts) {
        if let Some(Usage(tokens)) = head.extensions.get::<Usage>() {
            self.reported = Some(*tokens);
        }
    }

    fn on_frame(&mut self, data: &[u8]) {
        let mut rest = data;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            let (part, after) = rest.split_at(end);
            if !std::mem::take(&mut self.skipping) {
                let joined;
                let line = if self.line.is_empty() {
                    part
                } else {
                    self.line.extend_from_slice(part);
                    joined = std::mem::take(&mut self.line);
                    &joined[..]
                };
                self.on_line(line);
            }
            rest = &after[1..];
        }
        if self.skipping {
            return;
        }
        if self.line.len() + rest.len() > MAX_LINE {
            self.line.clear();
            self.skipping = true;
        } else {
            self.line.extend_from_slice(rest);
        }
    }

    fn usage(&self) -> u32 {
        self.reported.unwrap_or(self.deltas)
    }
}

/// The parts of a streamed chunk (or a JSON answer) that are counted.
#[derive(Deserialize)]
pub(super) struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    pub(super) usage: Option<UsageObject>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
}

#[derive(Deserialize, Default)]
struct Delta {
    content: Option<String>,
}

/// An answer's `usage` object.
#[derive(Deserialize)]
pub(super) struct UsageObject {
    pub(super) completion_tokens: u32,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn counted(frames: &[&[u8]]) -> u32 {
        let mut tokens = Tokens::default();
        for frame in frames {
            tokens.on_frame(frame);
        }
        tokens.usage()
    }

    const DELTA: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n";

    #[test]
    fn deltas_count_until_the_usage_object_replaces_them() {
        assert_eq!(counted(&[DELTA, DELTA, DELTA]), 3);
        let usage = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5,\"total_tokens\":14}}\n\ndata: [DONE]\n\n";
        assert_eq!(counted(&[DELTA, DELTA, usage]), 5);
        // An empty delta (the role, the finish reason) is no token.
        assert_eq!(
            counted(&[
                b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
                DELTA
            ]),
            1
        );
    }

    #[test]
    fn an_event_split_across_frames_counts_once_whole() {
        let (a, b) = DELTA.split_at(20);
        assert_eq!(counted(&[a]), 0);
        assert_eq!(counted(&[a, b, DELTA]), 2);
        let (c, d) = DELTA.split_at(DELTA.len() - 2);
        assert_eq!(counted(&[c, d]), 1);
    }

    #[test]
    fn junk_and_overlong_lines_count_nothing() {
        assert_eq!(counted(&[b"data: not json\n", b": comment\n", b"\n\n"]), 0);
        let long = vec![b'x'; MAX_LINE + 1];
        assert_eq!(counted(&[b"data: ", &long, &long, b"\n", DELTA]), 1);
    }
}
