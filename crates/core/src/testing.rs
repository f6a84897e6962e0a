//! What the library's unit tests share: a seeded pseudo-random stream for their generated inputs.

/// Marsaglia's xorshift64 from `seed` (non-zero): each call advances the state and returns it.
/// Deterministic, so a failing input is found again by the same seed.
#[cfg_attr(test, mutants::skip)]
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
