//! The command line: flags read one at a time, each value parsed with an
//! error that names its flag, and the one way a bad command line ends.

use std::fmt::Display;
use std::str::FromStr;

/// The flags after the program's name, read in order.
///
/// ```
/// # fn main() -> Result<(), String> {
/// let mut flags = outbox_bench::args::Flags::new(["--messages", "2000", "--mixed"]);
/// let (mut messages, mut mixed) = (0u64, false);
/// while let Some(flag) = flags.next_flag() {
///     match flag.as_str() {
///         "--messages" => messages = flags.parse(&flag)?,
///         "--mixed" => mixed = true,
///         other => return Err(format!("unknown argument {other:?}")),
///     }
/// }
/// assert_eq!((messages, mixed), (2000, true));
/// # Ok(())
/// # }
/// ```
pub struct Flags {
    /// What is left of the command line.
    rest: std::vec::IntoIter<String>,
}

impl Flags {
    /// The process's own command line, without the program's name.
    pub fn from_env() -> Self {
        Flags::new(std::env::args().skip(1))
    }

    /// The given words, as if they followed the program's name.
    pub fn new<S: Into<String>>(words: impl IntoIterator<Item = S>) -> Self {
        let words: Vec<String> = words.into_iter().map(Into::into).collect();
        Flags {
            rest: words.into_iter(),
        }
    }

    /// The next word, or `None` at the end.
    pub fn next_flag(&mut self) -> Option<String> {
        self.rest.next()
    }

    /// The word after `flag`, which must have one.
    pub fn value(&mut self, flag: &str) -> Result<String, String> {
        self.rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))
    }

    /// The word after `flag`, parsed; an error says which flag failed and
    /// why.
    pub fn parse<T>(&mut self, flag: &str) -> Result<T, String>
    where
        T: FromStr,
        T::Err: Display,
    {
        self.value(flag)?
            .parse()
            .map_err(|e| format!("{flag}: {e}"))
    }

    /// The word after `flag` as a comma-separated list, each item trimmed.
    pub fn list(&mut self, flag: &str) -> Result<Vec<String>, String> {
        Ok(self
            .value(flag)?
            .split(',')
            .map(|item| item.trim().to_owned())
            .collect())
    }
}

/// Ends the process the way every binary here refuses a bad command line:
/// the message on standard error, exit status 2.
pub fn refuse(message: impl Display) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_without_its_value_is_named() {
        let mut flags = Flags::new(["--store"]);
        let flag = flags.next_flag().unwrap();
        assert_eq!(flags.value(&flag), Err("--store needs a value".to_owned()));
    }

    #[test]
    fn a_value_that_does_not_parse_is_named() {
        let mut flags = Flags::new(["--messages", "many"]);
        let flag = flags.next_flag().unwrap();
        let error = flags.parse::<u64>(&flag).unwrap_err();
        assert!(error.starts_with("--messages: "), "{error}");
    }

    #[test]
    fn lists_are_split_at_commas_and_trimmed() {
        let mut flags = Flags::new(["--store", "memory, sqlite"]);
        let flag = flags.next_flag().unwrap();
        assert_eq!(flags.list(&flag).unwrap(), ["memory", "sqlite"]);
    }
}
