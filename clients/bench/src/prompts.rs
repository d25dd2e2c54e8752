//! Prompt texts. Both engines get exactly the same texts (the peer receives them in its
//! spec file), as raw completion prompts decoded greedily.

/// Subjects of the short concurrent prompts.
const SUBJECTS: [&str; 16] = [
    "the history of the Roman Empire",
    "how volcanoes form and erupt",
    "the life cycle of stars",
    "the invention of the printing press",
    "how the human heart works",
    "the migration of birds",
    "the causes of the French Revolution",
    "how computers store numbers",
    "the ecology of coral reefs",
    "the discovery of penicillin",
    "the geography of South America",
    "how bridges carry heavy loads",
    "the rules and history of chess",
    "the water cycle on Earth",
    "the industrial revolution in England",
    "how vaccines train the immune system",
];

/// Openings that frame a subject as the start of a long text.
const FRAMES: [&str; 4] = [
    "The following is a long and detailed essay about {}.\n\nChapter 1.",
    "Lecture notes, part one: an introduction to {}.\n\nIn this lecture we will",
    "Here is a complete, step by step explanation of {}, written for students.\n\n1.",
    "A long article about {}\n\nIntroduction\n\nFor centuries,",
];

/// The prompt of the single-stream decode run.
pub fn decode_prompt() -> String {
    FRAMES[0].replace(
        "{}",
        "the history of mathematics from ancient Babylon to today",
    )
}

/// `n` distinct short prompts for the concurrency runs (distinct for up to 64, then the
/// index is appended to keep them distinct).
pub fn concurrent_prompts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let subject = SUBJECTS[i % SUBJECTS.len()];
            let frame = FRAMES[(i / SUBJECTS.len()) % FRAMES.len()];
            let text = frame.replace("{}", subject);
            if i < SUBJECTS.len() * FRAMES.len() {
                text
            } else {
                format!("({i}) {text}")
            }
        })
        .collect()
}

/// Sentences the long prefill prompt is built from.
const SENTENCES: [&str; 24] = [
    "The river winds through the valley for {} miles before it reaches the sea.",
    "In the year {}, the town council voted to build a new library near the market square.",
    "Farmers in the region grow wheat, barley and {} kinds of apples on the hillsides.",
    "The old lighthouse has guided ships along the rocky coast for {} years.",
    "Scientists measured the temperature of the lake every morning for {} days.",
    "Her grandmother kept a notebook of recipes, with {} pages of careful handwriting.",
    "The train leaves the northern station at {} minutes past seven every weekday.",
    "A small museum on the corner displays {} paintings by local artists.",
    "During the winter storms, the mountain pass is closed for about {} weeks.",
    "The orchestra rehearsed the new symphony {} times before the opening night.",
    "Engineers tested the bridge with trucks weighing {} tons each.",
    "The village bakery sells {} loaves of bread before noon on Saturdays.",
    "Students in the chemistry class recorded {} observations about the reaction.",
    "The forest trail climbs {} meters through pine trees and mossy rocks.",
    "A fishing boat returned to the harbor with {} crates of fresh mackerel.",
    "The committee reviewed {} proposals for the new public garden.",
    "Astronomers counted {} meteors during the clear night in August.",
    "The factory produced {} bicycles in its first month of operation.",
    "Children at the school planted {} trees along the edge of the playground.",
    "The library catalog lists {} books about the history of the region.",
    "A traveler walked {} kilometers along the coast in a single week.",
    "The weather station recorded {} millimeters of rain during the spring.",
    "Musicians from {} countries performed at the summer festival.",
    "The old clock in the tower has been repaired {} times since it was built.",
];

/// A long text of varied sentences; `variant` changes its beginning and numbers, so two
/// variants share no prefix (a prefix cache cannot shorten a repetition).
pub fn long_text(variant: usize, sentences: usize) -> String {
    let mut text = format!("Report number {}.", 1000 + variant * 7919 % 9000);
    for i in 0..sentences {
        let k = i + variant * 5;
        let sentence = SENTENCES[(k * 7 + variant) % SENTENCES.len()];
        let number = 3 + (k * 37 + variant * 101) % 997;
        text.push(' ');
        text.push_str(&sentence.replace("{}", &number.to_string()));
        if i % 6 == 5 {
            text.push_str("\n\n");
            text.push_str(&format!("Section {}.", i / 6 + 2));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_prompts_are_distinct() {
        let prompts = concurrent_prompts(80);
        let mut sorted = prompts.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), prompts.len());
    }

    #[test]
    fn long_text_variants_differ_at_start() {
        let a = long_text(0, 10);
        let b = long_text(1, 10);
        assert_ne!(a.split('.').next(), b.split('.').next());
    }
}
