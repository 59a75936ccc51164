//! Random bytes at memory speed: a fast-key-erasure generator over AES-256-CTR (aws-lc-rs, AES-NI
//! / ARMv8 CE), seeded from the OS and mixed with TPM2_GetRandom entropy at start and then
//! periodically (the TPM's RNG is ~2 KB/s on a firmware TPM: it seeds, it never serves
//! requests).
//!
//! Each request derives a one-off AES key from the state under a short lock and advances the
//! state (so earlier output cannot be recomputed from a later state), then generates outside
//! the lock. Reseed: `state = SHA-256(state || os(32) || tpm(32) || counter)`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_lc_rs::cipher::{EncryptingKey, EncryptionContext, UnboundCipherKey, AES_256};
use zeroize::Zeroizing;

use crate::error::Error;

/// Largest single request.
pub const MAX_REQUEST: usize = 16 * 1024 * 1024;
/// Reseed from the OS (and the TPM, when given) at least this often.
pub const RESEED_INTERVAL: Duration = Duration::from_secs(600);

struct State {
    key: Zeroizing<[u8; 32]>,
    counter: u64,
    reseeded: Instant,
}

/// The generator.
pub struct Drbg {
    state: Mutex<State>,
}

impl std::fmt::Debug for Drbg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drbg").finish_non_exhaustive()
    }
}

impl Drbg {
    /// Seeds from the OS and `tpm_entropy` (may be empty when the TPM is unavailable).
    ///
    /// # Errors
    /// [`Error::Internal`] if the OS RNG fails.
    pub fn new(tpm_entropy: &[u8]) -> Result<Self, Error> {
        let drbg =
            Self { state: Mutex::new(State { key: Zeroizing::new([0; 32]), counter: 0, reseeded: Instant::now() }) };
        drbg.reseed(tpm_entropy)?;
        Ok(drbg)
    }

    /// Mixes fresh OS randomness and `tpm_entropy` into the state.
    ///
    /// # Errors
    /// [`Error::Internal`] if the OS RNG fails.
    pub fn reseed(&self, tpm_entropy: &[u8]) -> Result<(), Error> {
        let mut os = Zeroizing::new([0u8; 32]);
        aws_lc_rs::rand::fill(os.as_mut()).map_err(|_| Error::Internal("OS RNG failure".into()))?;
        let mut st = self.state.lock().map_err(|_| Error::Internal("DRBG lock".into()))?;
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        ctx.update(st.key.as_ref());
        ctx.update(os.as_ref());
        ctx.update(tpm_entropy);
        ctx.update(&st.counter.to_be_bytes());
        st.key.copy_from_slice(ctx.finish().as_ref());
        st.reseeded = Instant::now();
        Ok(())
    }

    /// True when a periodic reseed is due.
    pub fn reseed_due(&self) -> bool {
        self.state.lock().map(|s| s.reseeded.elapsed() >= RESEED_INTERVAL).unwrap_or(true)
    }

    /// Fills `out` with random bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] over [`MAX_REQUEST`]; [`Error::Internal`] on cipher failure.
    pub fn fill(&self, out: &mut [u8]) -> Result<(), Error> {
        if out.len() > MAX_REQUEST {
            return Err(Error::invalid(format!("at most {MAX_REQUEST} random bytes per request")));
        }
        // Derive this request's key and the next state from the current state: 64 bytes of
        // keystream, first half the request key, second half the new state.
        let request_key = {
            let mut st = self.state.lock().map_err(|_| Error::Internal("DRBG lock".into()))?;
            let mut block = Zeroizing::new([0u8; 64]);
            ctr(st.key.as_ref(), st.counter, block.as_mut())?;
            st.counter = st.counter.wrapping_add(1);
            st.key.copy_from_slice(&block[32..]);
            let mut k = Zeroizing::new([0u8; 32]);
            k.copy_from_slice(&block[..32]);
            k
        };
        out.fill(0);
        ctr(request_key.as_ref(), 0, out)
    }
}

/// AES-256-CTR keystream into `buf` (encrypting zeros), IV = counter || 0.
fn ctr(key: &[u8], counter: u64, buf: &mut [u8]) -> Result<(), Error> {
    let fail = || Error::Internal("AES-CTR".into());
    let key = EncryptingKey::ctr(UnboundCipherKey::new(&AES_256, key).map_err(|_| fail())?).map_err(|_| fail())?;
    let mut iv = [0u8; 16];
    iv[..8].copy_from_slice(&counter.to_be_bytes());
    key.less_safe_encrypt(buf, EncryptionContext::Iv128(iv.into())).map_err(|_| fail())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_differ_and_look_random() {
        let d = Drbg::new(b"tpm").unwrap_or_else(|e| panic!("{e}"));
        let mut a = vec![0u8; 1 << 16];
        let mut b = vec![0u8; 1 << 16];
        d.fill(&mut a).unwrap_or_else(|e| panic!("{e}"));
        d.fill(&mut b).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a, b);
        // Crude sanity: every byte value appears, and the bit balance is near 1/2.
        let ones: u32 = a.iter().map(|x| x.count_ones()).sum();
        let ratio = f64::from(ones) / (a.len() as f64 * 8.0);
        assert!((0.49..0.51).contains(&ratio), "{ratio}");
        let mut seen = [false; 256];
        a.iter().for_each(|&x| seen[usize::from(x)] = true);
        assert!(seen.iter().all(|&s| s));
        assert!(d.fill(&mut vec![0u8; MAX_REQUEST + 1]).is_err());
    }

    #[test]
    fn two_generators_never_agree() {
        let a = Drbg::new(&[]).unwrap_or_else(|e| panic!("{e}"));
        let b = Drbg::new(&[]).unwrap_or_else(|e| panic!("{e}"));
        let (mut x, mut y) = ([0u8; 32], [0u8; 32]);
        a.fill(&mut x).unwrap_or_else(|e| panic!("{e}"));
        b.fill(&mut y).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(x, y);
    }
}
