//! Prompt texts of the speculative-decoding scenario (`--scenario speculative`): chat
//! requests whose answers quote or edit a document given in the prompt (where n-gram
//! lookup finds its drafts) and open-ended ones (where it finds few). Both engines get
//! the same texts: inferd as chat `messages`, llama-server as the ids of their ChatML
//! rendering (see [`crate::speculative`]).

use serde::Serialize;

/// The system message of every prompt (an explicit one, so the chat template adds no
/// default and the ChatML rendering given to llama-server is exact).
pub const SYSTEM: &str = "You are a helpful assistant.";

/// What a prompt asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Summarise a ~40-line passage, quoting its sentences.
    Quotes,
    /// Output a 60-line Python file with its one bug fixed.
    CodeFix,
    /// Repeat a 30-item list with one item changed.
    ListEdit,
    /// A question without a document.
    OpenEnded,
}

impl Kind {
    /// Whether the answer copies text from the prompt.
    pub fn extractive(self) -> bool {
        self != Kind::OpenEnded
    }
}

/// One chat prompt (the user message; the system message is [`SYSTEM`]).
#[derive(Debug, Clone, Serialize)]
pub struct PromptText {
    /// Short name for tables and the JSON, e.g. `code-fix-0`.
    pub name: String,
    pub kind: Kind,
    pub user: String,
}

/// The passage of the "summarise with quotes" prompts: 40 lines, one sentence each.
const PASSAGE: &str = "\
Wexmoor is a small harbour town on the northern coast, built where the river Alde meets the sea.
The first houses were put up by fishing families in the year 1412, on the dry ground above the marsh.
For three centuries the town lived almost entirely from herring, which arrived in huge shoals every autumn.
In a good season the fleet of forty boats landed more than two thousand barrels of salted fish.
The herring were packed in salt from the pans south of the river and shipped to markets in the south.
In 1688 a great storm destroyed the old wooden pier and sank eleven boats in a single night.
The townspeople rebuilt the pier in stone, and the new pier still stands at the end of Quay Street.
A customs house was added in 1724, and its clerks recorded every cargo that passed through the harbour.
Their ledgers show timber from Norway, wine from Bordeaux and coal from the mines of the west.
By 1800 Wexmoor had a rope works, two boatyards, a brewery and a market held every Thursday.
The harbour master at that time, Elias Crane, kept a diary that the town museum still displays.
Crane wrote that the harbour mouth silted up every winter and had to be dug out by hand each spring.
In 1843 engineers built a long breakwater of granite blocks to keep the sand out of the channel.
The breakwater worked, and larger ships began to call at Wexmoor on their way along the coast.
The railway reached the town in 1861, and fresh fish could now be sold in the city the next morning.
With the railway came visitors, who walked on the beach and stayed in new hotels on the cliff.
The largest hotel, the Grand Alde, had ninety rooms and a glass hall where a band played on Sundays.
Fishing remained the main work of the town, but tourism grew a little every year.
The winters in Wexmoor are long and windy, and the sea often freezes along the edges of the marsh.
The summers are short and mild, with fog that rolls in from the sea on most mornings in July.
Old fishermen say that a red sky over the breakwater means a calm day and a good catch.
In 1907 the herring shoals suddenly stopped coming, and nobody has ever fully explained why.
Within ten years half of the fishing boats had been sold, and many families left for the cities.
The rope works closed in 1919, and the brewery was turned into a warehouse for the railway.
The town council tried to attract new trades by building a small factory for canned vegetables.
The factory opened in 1925 and employed about two hundred people, most of them women from the town.
During the war of 1939 the harbour was used by patrol boats, and the hotels housed soldiers.
After the war the railway line was closed, and the station became a library and a reading room.
In the 1960s artists discovered the old fishermen's cottages and the clear northern light.
A painters' school was founded in the former customs house, and it still runs courses every summer.
Today about four thousand people live in Wexmoor, and in August the population nearly doubles.
Six fishing boats still work from the harbour, landing crab, lobster and a little cod.
The museum on Quay Street tells the story of the herring years with boats, nets and photographs.
Its most famous object is the diary of Elias Crane, open at the page describing the hard winter of 1801.
Every September the town holds a herring festival, with music, races on the water and smoked fish.
The festival ends with a procession of lanterns along the breakwater to the small lighthouse.
The lighthouse was built in 1851 and was kept by the same family for more than a century.
Its light can be seen twenty miles out at sea, and it still flashes white every ten seconds.
Local people are proud of their harbour, and many of them still call the breakwater simply the Wall.
Visitors who stay for a week often say that the hardest part of Wexmoor is leaving it.
";

/// Instructions of the quote prompts, one per variant.
const QUOTE_TASKS: [&str; 6] = [
    "Summarise the passage below in five bullet points. Each bullet point must quote, word \
     for word and in double quotes, the sentence of the passage it is based on.",
    "Summarise what the passage below says about the harbour and its ships in four bullet \
     points. Quote, word for word and in double quotes, the sentence each point is based on.",
    "Summarise what the passage below says about the people of the town in four bullet \
     points, each with a word-for-word quotation in double quotes of the sentence it uses.",
    "Summarise what the passage below says about the weather and the seasons, quoting every \
     sentence you use word for word in double quotes.",
    "List the six most important facts of the passage below. Give each one as a \
     word-for-word quotation of its sentence, in double quotes.",
    "Summarise the passage below in three bullet points, quoting word for word and in double \
     quotes the sentences that give years or numbers.",
];

/// The Python file of the "fix one line" prompts: 60 lines, correct as written;
/// each variant puts one bug of [`CODE_BUGS`] into it.
const CODE: &str = r#""""Inventory of a small warehouse: items, stock levels and sales."""

from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0


@dataclass
class Inventory:
    items: dict = field(default_factory=dict)

    def add(self, name, price, quantity=0):
        self.items[name] = Item(name, price, quantity)

    def restock(self, name, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.items[name].quantity += amount

    def sell(self, name, amount):
        item = self.items[name]
        if amount > item.quantity:
            raise ValueError(f"only {item.quantity} {name} left")
        item.quantity -= amount
        return amount * item.price

    def total_value(self):
        total = 0.0
        for item in self.items.values():
            total += item.price * item.quantity
        return total

    def low_stock(self, threshold=5):
        return [item.name for item in self.items.values() if item.quantity < threshold]

    def average_price(self):
        if not self.items:
            return 0.0
        return sum(item.price for item in self.items.values()) / len(self.items)


def main():
    inventory = Inventory()
    inventory.add("hammer", 12.5, 10)
    inventory.add("screwdriver", 4.0, 25)
    inventory.add("saw", 20.0, 3)
    inventory.restock("saw", 4)
    inventory.sell("hammer", 2)
    print("value:", inventory.total_value())
    print("low stock:", inventory.low_stock())
    print("average price:", inventory.average_price())


if __name__ == "__main__":
    main()
"#;

/// (correct line, buggy line): variant `i` replaces the first with the second.
const CODE_BUGS: [(&str, &str); 6] = [
    (
        "        item.quantity -= amount",
        "        item.quantity += amount",
    ),
    (
        "            total += item.price * item.quantity",
        "            total += item.price + item.quantity",
    ),
    (
        "        if amount > item.quantity:",
        "        if amount < item.quantity:",
    ),
    (
        "        self.items[name].quantity += amount",
        "        self.items[name].quantity -= amount",
    ),
    (
        "        return sum(item.price for item in self.items.values()) / len(self.items)",
        "        return sum(item.price for item in self.items.values()) * len(self.items)",
    ),
    (
        "        return [item.name for item in self.items.values() if item.quantity < threshold]",
        "        return [item.name for item in self.items.values() if item.quantity > threshold]",
    ),
];

/// The list of the "repeat with one change" prompts: 30 items.
const LIST: [&str; 30] = [
    "Tent with rain cover",
    "Sleeping bag",
    "Sleeping mat",
    "Camping stove",
    "Two gas canisters",
    "Cooking pot with lid",
    "Frying pan",
    "Plates and cups",
    "Knife, fork and spoon",
    "Water filter",
    "Three water bottles",
    "Head torch",
    "Spare batteries",
    "First aid kit",
    "Sun cream",
    "Insect repellent",
    "Rain jacket",
    "Warm fleece",
    "Walking boots",
    "Two pairs of socks",
    "Hat and gloves",
    "Map of the area",
    "Compass",
    "Pocket knife",
    "Rope, ten metres",
    "Matches in a dry bag",
    "Rubbish bags",
    "Toilet paper",
    "Small towel",
    "Notebook and pencil",
];

/// (item number, new item): variant `i` asks for this change.
const LIST_CHANGES: [(usize, &str); 6] = [
    (17, "Waterproof poncho"),
    (5, "Three gas canisters"),
    (23, "GPS receiver"),
    (9, "Folding spork"),
    (28, "Wet wipes"),
    (12, "Lantern"),
];

/// The open-ended prompts.
const OPEN_ENDED: [(&str, &str); 3] = [
    ("story", "Write a short story about a lighthouse keeper."),
    ("rainbows", "Explain how rainbows form."),
    ("interview", "Give advice for a first job interview."),
];

/// How many variants each extractive kind has (distinct prompts for 18 streams).
pub const VARIANTS: usize = 6;

/// The quote prompt of variant `v` (mod [`VARIANTS`]).
pub fn quotes(v: usize) -> PromptText {
    let v = v % VARIANTS;
    PromptText {
        name: format!("quotes-{v}"),
        kind: Kind::Quotes,
        user: format!("{}\n\n{PASSAGE}", QUOTE_TASKS[v]),
    }
}

/// The code file with bug `v` (mod [`VARIANTS`]) in it.
pub fn buggy_code(v: usize) -> String {
    let (good, bad) = CODE_BUGS[v % VARIANTS];
    CODE.replacen(good, bad, 1)
}

/// The code-fix prompt of variant `v` (mod [`VARIANTS`]).
pub fn code_fix(v: usize) -> PromptText {
    let v = v % VARIANTS;
    PromptText {
        name: format!("code-fix-{v}"),
        kind: Kind::CodeFix,
        user: format!(
            "The Python file below has exactly one bug, an obviously wrong line. Output the \
             whole corrected file, unchanged except for the fixed line, in one ```python code \
             block.\n\n```python\n{}```",
            buggy_code(v)
        ),
    }
}

/// The list-edit prompt of variant `v` (mod [`VARIANTS`]).
pub fn list_edit(v: usize) -> PromptText {
    let v = v % VARIANTS;
    let (number, new) = LIST_CHANGES[v];
    let list: String = LIST
        .iter()
        .enumerate()
        .map(|(i, item)| format!("{}. {item}\n", i + 1))
        .collect();
    PromptText {
        name: format!("list-edit-{v}"),
        kind: Kind::ListEdit,
        user: format!(
            "Repeat the packing list below exactly, with one change: replace item {number} \
             (\"{}\") with \"{new}\". Output all {} items, numbered as they are.\n\n{list}",
            LIST[number - 1],
            LIST.len()
        ),
    }
}

/// The open-ended prompts.
pub fn open_ended() -> Vec<PromptText> {
    OPEN_ENDED
        .iter()
        .map(|(name, user)| PromptText {
            name: (*name).to_owned(),
            kind: Kind::OpenEnded,
            user: (*user).to_owned(),
        })
        .collect()
}

/// The single-stream prompts: the first variant of each extractive kind, then the
/// open-ended ones.
pub fn single_stream() -> Vec<PromptText> {
    let mut prompts = vec![quotes(0), code_fix(0), list_edit(0)];
    prompts.extend(open_ended());
    prompts
}

/// `n` extractive prompts for the concurrent streams: the kinds in turn, each kind's
/// variants in turn (distinct for up to 3 × [`VARIANTS`] streams).
pub fn streams(n: usize) -> Vec<PromptText> {
    (0..n)
        .map(|i| match i % 3 {
            0 => quotes(i / 3),
            1 => code_fix(i / 3),
            _ => list_edit(i / 3),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_have_their_sizes() {
        assert_eq!(PASSAGE.lines().count(), 40);
        assert_eq!(CODE.lines().count(), 60);
        assert_eq!(LIST.len(), 30);
    }

    #[test]
    fn each_bug_changes_exactly_one_line() {
        for (i, (good, bad)) in CODE_BUGS.iter().enumerate() {
            assert_eq!(CODE.lines().filter(|l| l == good).count(), 1, "bug {i}");
            assert!(!CODE.lines().any(|l| l == *bad), "bug {i}");
            let buggy = buggy_code(i);
            let changed = CODE
                .lines()
                .zip(buggy.lines())
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(changed, 1, "bug {i}");
            assert_eq!(buggy.lines().count(), 60);
        }
    }

    #[test]
    fn list_changes_name_real_items() {
        for (number, new) in LIST_CHANGES {
            assert!((1..=LIST.len()).contains(&number));
            assert!(!LIST.contains(&new));
        }
        let p = list_edit(0);
        assert!(p.user.contains("replace item 17 (\"Rain jacket\")"));
        assert!(p.user.contains("30. Notebook and pencil\n"));
    }

    #[test]
    fn stream_prompts_are_distinct_and_extractive() {
        let prompts = streams(16);
        let mut users: Vec<&str> = prompts.iter().map(|p| p.user.as_str()).collect();
        users.sort();
        users.dedup();
        assert_eq!(users.len(), 16);
        assert!(prompts.iter().all(|p| p.kind.extractive()));
        let single = single_stream();
        assert_eq!(single.iter().filter(|p| p.kind.extractive()).count(), 3);
        assert_eq!(single.iter().filter(|p| !p.kind.extractive()).count(), 3);
    }
}
