//! Symbol tables and tokenization modes.

use asrforge::data::tokenizer::{SymbolTable, TokenizeMode, Tokenizer};

const UNITS: &str = "<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 4\nC 5\n<noise> 6\nHELLO 7\n\u{2581}HE 8\nLL 9\nO 10\n<sos/eos> 11\n";

fn table() -> SymbolTable {
    SymbolTable::parse(UNITS, "units.txt").unwrap()
}

#[test]
fn char_mode_maps_space_and_unknowns() {
    let tok = Tokenizer::new(table(), TokenizeMode::Char, vec![]);
    assert_eq!(tok.tokens("AB C"), vec!["A", "B", "\u{2581}", "C"]);
    assert_eq!(tok.encode("AB C"), vec![3, 4, 2, 5]);
    assert_eq!(tok.encode("AZ"), vec![3, 1], "Z is <unk>");
    assert_eq!(tok.table().len(), 12);
    assert_eq!(tok.table().get("<sos/eos>"), Some(11));
}

#[test]
fn word_mode_and_non_language_symbols() {
    let tok = Tokenizer::new(table(), TokenizeMode::Word, vec!["<noise>".into()]);
    assert_eq!(tok.encode("HELLO <noise> A  B"), vec![7, 6, 3, 4]);
    let chars = Tokenizer::new(table(), TokenizeMode::Char, vec!["<noise>".into()]);
    assert_eq!(chars.tokens("A<noise>B"), vec!["A", "<noise>", "B"]);
}

#[test]
fn wordpiece_is_greedy_longest_match() {
    let tok = Tokenizer::new(table(), TokenizeMode::WordPiece, vec![]);
    assert_eq!(tok.tokens("HELLO"), vec!["\u{2581}HE", "LL", "O"]);
    assert_eq!(tok.encode("HELLO A"), vec![8, 9, 10, 2, 3]);
}

#[test]
fn malformed_tables_are_errors_with_line_numbers() {
    let e = SymbolTable::parse("A 1\nB x\n", "u.txt").unwrap_err().to_string();
    assert!(e.contains("u.txt") && e.contains("line 2") && e.contains("`x`"), "{e}");
    let e = SymbolTable::parse("\n\n", "u.txt").unwrap_err().to_string();
    assert!(e.contains("found none"), "{e}");
}

#[test]
fn a_symbol_table_the_model_cannot_mean_is_an_error_naming_file_and_line() {
    let err = |text: &str| SymbolTable::parse(text, "units.txt").unwrap_err().to_string();
    let e = err("<blank> 0\nA 1\nB 1\n");
    assert!(e.starts_with("units.txt: line 3:") && e.contains("id 1") && e.contains("`A` (line 2)"), "{e}");
    let e = err("<blank> 0\nA 1\nA 2\n");
    assert!(e.starts_with("units.txt: line 3:") && e.contains("token `A` appears twice (first at line 2)"), "{e}");
    let e = err("<unk> 0\nA 1\n");
    assert!(e.starts_with("units.txt: line 1:") && e.contains("expected `<blank>` at id 0") && e.contains("found `<unk>`"), "{e}");
    let e = err("<blank> 1\nA 2\n");
    assert!(e.contains("no id 0"), "{e}");
    let e = err("<blank> 0\nA 1\nB 3\n");
    assert!(e.starts_with("units.txt: line 3:") && e.contains("contiguous ids 0..2") && e.contains("no id 2"), "{e}");
    let e = err("<blank> 0\nA -1\n");
    assert!(e.starts_with("units.txt: line 2:") && e.contains("found -1"), "{e}");
    // A well-formed table (blank lines allowed) parses, and knows its path.
    let t = SymbolTable::parse("<blank> 0\n\n<unk> 1\nA 2\n<sos/eos> 3\n", "units.txt").unwrap();
    assert_eq!((t.len(), t.get("<sos/eos>"), t.path()), (4, Some(3), "units.txt"));
}
