//! Secrets: fresh random ones, and comparing a given one with the expected
//! one without leaking by its timing how much of it matched.

/// `bytes` random bytes from the operating system, in hex.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the operating system has no random source");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal without telling by its timing how much of a secret matched.
pub(crate) fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}
