//! The model's rules, each checked against a real swtpm behind it: slots, loading and saving
//! around every command, virtual handles, the filtered capability, out-of-slots failures,
//! sessions flushed on close, a client's own ContextSave/ContextLoad, and the profile's time
//! (scaled) with one command at a time across clients.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tpm_vault_daemon::harness::Swtpm;
use tpm_vault_tpm_model::wire::{self, cc};
use tpm_vault_tpm_model::{Endpoint, Model, ModelBuilder, Profile, Tally};
use tss_esapi::constants::SessionType;
use tss_esapi::handles::{KeyHandle, ObjectHandle, TpmHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, RsaSchemeAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::{
    Digest, EccScheme, HashScheme, HashcheckTicket, Public, RsaExponent, RsaScheme, SignatureScheme,
    SymmetricDefinition,
};
use tss_esapi::tss2_esys::TPMT_TK_HASHCHECK;
use tss_esapi::utils::{create_unrestricted_signing_ecc_public, create_unrestricted_signing_rsa_public};
use tss_esapi::{Context, TctiNameConf};

/// TSS2_TCTI_RC_IO_ERROR: what a failed `write()` on /dev/tpmrm0 gives, and what the model's
/// closed connection gives.
const TCTI_IO_ERROR: u32 = 0x000A_000A;
/// TPM_RC_OBJECT_MEMORY.
const RC_OBJECT_MEMORY: u32 = 0x902;
/// TPM_RC_SESSION_MEMORY.
const RC_SESSION_MEMORY: u32 = 0x903;

struct Fixture {
    model: Model,
    _swtpm: Swtpm,
    _dir: tempfile::TempDir,
}

fn fixture(profile: Profile, speed: f64) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let swtpm = Swtpm::start(dir.path()).expect("swtpm");
    let model = ModelBuilder::new(swtpm.port()).with_profile(profile).with_speed(speed).build().expect("model");
    Fixture { model, _swtpm: swtpm, _dir: dir }
}

fn connect(ep: &Endpoint) -> Context {
    let conf: TctiNameConf = ep.tcti().parse().expect("tcti");
    Context::new(conf).expect("context")
}

fn ecc_key() -> Public {
    create_unrestricted_signing_ecc_public(
        EccScheme::EcDsa(HashScheme::new(HashingAlgorithm::Sha256)),
        EccCurve::NistP256,
    )
    .expect("template")
}

fn rsa_key() -> Public {
    create_unrestricted_signing_rsa_public(
        RsaScheme::create(RsaSchemeAlgorithm::RsaSsa, Some(HashingAlgorithm::Sha256)).expect("scheme"),
        RsaKeyBits::Rsa2048,
        RsaExponent::default(),
    )
    .expect("template")
}

fn primary(ctx: &mut Context, template: Public) -> Result<KeyHandle, tss_esapi::Error> {
    ctx.execute_with_session(Some(AuthSession::Password), |c| {
        c.create_primary(Hierarchy::Owner, template, None, None, None, None)
    })
    .map(|r| r.key_handle)
}

fn sign(ctx: &mut Context, key: KeyHandle) {
    let ticket = HashcheckTicket::try_from(TPMT_TK_HASHCHECK {
        tag: tss_esapi::constants::tss::TPM2_ST_HASHCHECK,
        hierarchy: tss_esapi::constants::tss::TPM2_RH_NULL,
        digest: Default::default(),
    })
    .expect("ticket");
    let digest = Digest::try_from(vec![7u8; 32]).expect("digest");
    ctx.execute_with_session(Some(AuthSession::Password), |c| c.sign(key, digest, SignatureScheme::Null, ticket))
        .expect("sign");
}

/// GetCapability(TPM_CAP_HANDLES) from `first` (saved sessions, 0x03..., are listed under
/// their HMAC or policy session handles), sent raw: tss-esapi refuses 0x80FFFFFF, the
/// kernel's first virtual handle, as a transient handle (its TPM2_TRANSIENT_LAST is 0x80FFFFFE),
/// so its `get_capability` fails with InvalidParam while slot 0 is used.
fn handles(ep: &Endpoint, first: u32) -> Vec<u32> {
    let mut body = wire::CAP_HANDLES.to_be_bytes().to_vec();
    body.extend_from_slice(&first.to_be_bytes());
    body.extend_from_slice(&64u32.to_be_bytes());
    let rsp = raw(ep, &wire::command(wire::ST_NO_SESSIONS, cc::GET_CAPABILITY, &body)).expect("capability");
    assert_eq!(wire::header(&rsp).code, 0);
    let count = wire::u32_at(&rsp, 15).unwrap_or(0) as usize;
    let mut list: Vec<u32> = (0..count)
        .filter_map(|i| wire::u32_at(&rsp, 19 + 4 * i))
        .filter(|h| first >> 24 != 0x80 || h >> 24 == 0x80)
        .collect();
    list.sort_unstable();
    list
}

/// The raw TSS2_RC of an error (tss-esapi prints it in hex but keeps it private).
fn tss_rc(e: &tss_esapi::Error) -> u32 {
    use tss_esapi::constants::response_code::Tss2ResponseCode as C;
    let text = match e {
        tss_esapi::Error::Tss2Error(C::FormatZero(z)) => z.to_string(),
        tss_esapi::Error::Tss2Error(C::FormatOne(o)) => o.to_string(),
        other => panic!("not a TSS error code: {other}"),
    };
    text.rsplit("0x").next().and_then(|h| u32::from_str_radix(h.trim(), 16).ok()).unwrap_or(u32::MAX)
}

/// Sends one raw command to an endpoint; `None` when the model closed the connection.
fn raw(ep: &Endpoint, cmd: &[u8]) -> Option<Vec<u8>> {
    let mut c = TcpStream::connect(("127.0.0.1", ep.port())).expect("connect");
    c.write_all(cmd).expect("write");
    let mut head = [0u8; 10];
    c.read_exact(&mut head).ok()?;
    let size = u32::from_be_bytes([head[2], head[3], head[4], head[5]]) as usize;
    let mut rsp = head.to_vec();
    rsp.resize(size, 0);
    c.read_exact(&mut rsp[10..]).ok()?;
    Some(rsp)
}

fn delta(ep: &Endpoint, before: &Tally) -> Tally {
    ep.stats().tpm.since(before)
}

#[test]
fn objects_get_virtual_handles_and_are_loaded_and_saved_around_every_command() {
    let f = fixture(Profile::none(), 1.0);
    let ep = f.model.open().expect("endpoint");
    let mut ctx = connect(&ep);
    let a = primary(&mut ctx, ecc_key()).expect("first");
    assert_eq!(handles(&ep, 0x8000_0000), vec![0x80FF_FFFF]);
    let b = primary(&mut ctx, ecc_key()).expect("second");
    assert_eq!(handles(&ep, 0x8000_0000), vec![0x80FF_FFFE, 0x80FF_FFFF]);
    assert_eq!(ep.stats().objects, 2);

    // A signature with two objects in the space: both loaded before, saved and flushed after.
    // (swtpm answers the first ECDSA signature of its life with TPM_RC_RETRY: warm it up.)
    sign(&mut ctx, b);
    let before = ep.stats().tpm;
    sign(&mut ctx, b);
    let d = delta(&ep, &before);
    assert_eq!(d.count(cc::SIGN), 1);
    assert_eq!(d.count(cc::CONTEXT_LOAD), 2);
    assert_eq!(d.count(cc::CONTEXT_SAVE), 2);
    assert_eq!(d.count(cc::FLUSH_CONTEXT), 2);
    assert_eq!(d.commands(), 7, "{}", d.describe(1));

    // Nothing stays loaded between commands: a second space fits three more objects although
    // swtpm itself has three object slots.
    let ep2 = f.model.open().expect("second endpoint");
    let mut ctx2 = connect(&ep2);
    for _ in 0..3 {
        primary(&mut ctx2, ecc_key()).expect("object in the second space");
    }
    sign(&mut ctx, a);
    assert_eq!(f.model.stats().spaces.len(), 2);
    assert_eq!(f.model.total().count(cc::SIGN), 4);
}

#[test]
fn capability_lists_only_the_spaces_own_transient_objects() {
    let f = fixture(Profile::none(), 1.0);
    let (ep1, ep2) = (f.model.open().expect("endpoint"), f.model.open().expect("endpoint"));
    let (mut c1, mut c2) = (connect(&ep1), connect(&ep2));
    primary(&mut c1, ecc_key()).expect("object");
    primary(&mut c1, ecc_key()).expect("object");
    primary(&mut c2, ecc_key()).expect("object");
    assert_eq!(handles(&ep1, 0x8000_0000), vec![0x80FF_FFFE, 0x80FF_FFFF]);
    assert_eq!(handles(&ep2, 0x8000_0000), vec![0x80FF_FFFF]);
}

#[test]
fn a_fourth_object_fails_in_the_tpm_and_the_space_recovers_after_a_flush() {
    let f = fixture(Profile::none(), 1.0);
    let ep = f.model.open().expect("endpoint");
    let mut ctx = connect(&ep);
    for _ in 0..3 {
        primary(&mut ctx, ecc_key()).expect("three objects fit");
    }
    // The three are loaded for the command and fill the TPM (3 object slots, like the
    // reference implementation): the TPM itself answers TPM_RC_OBJECT_MEMORY.
    let before = ep.stats().tpm;
    let err = primary(&mut ctx, ecc_key()).expect_err("the fourth has no room");
    assert_eq!(tss_rc(&err), RC_OBJECT_MEMORY, "{err}");
    let s = ep.stats();
    assert_eq!((s.out_of_slots, s.failed, s.objects), (0, 0, 3));
    assert_eq!(delta(&ep, &before).describe(1), "CreatePrimary 1, ContextLoad 3, ContextSave 3, FlushContext 3");

    // The space still holds the three (as virtual handles); flushing one makes room.
    assert_eq!(handles(&ep, 0x8000_0000).len(), 3);
    let obj = ctx
        .execute_without_session(|c| c.tr_from_tpm_public(TpmHandle::try_from(0x80FF_FFFEu32).expect("handle")))
        .expect("ReadPublic through a virtual handle");
    ctx.flush_context(obj).expect("FlushContext of a virtual handle");
    assert_eq!(ep.stats().objects, 2);
    primary(&mut ctx, ecc_key()).expect("a slot is free again");
    assert_eq!(handles(&ep, 0x8000_0000), vec![0x80FF_FFFD, 0x80FF_FFFE, 0x80FF_FFFF]);
}

#[test]
fn out_of_slots_in_the_space_fails_like_enomem_and_flushes_the_new_object() {
    // Two slots per space, so the TPM still has room for the object the command makes and
    // the resource manager's own check is what fails it.
    let dir = tempfile::tempdir().expect("temp dir");
    let swtpm = Swtpm::start(dir.path()).expect("swtpm");
    let model = ModelBuilder::new(swtpm.port()).with_slots(2, 2).build().expect("model");
    let ep = model.open().expect("endpoint");
    let mut ctx = connect(&ep);
    for _ in 0..2 {
        primary(&mut ctx, ecc_key()).expect("two objects fit");
    }
    let before = ep.stats().tpm;
    let err = primary(&mut ctx, ecc_key()).expect_err("no slot for a third");
    assert_eq!(tss_rc(&err), TCTI_IO_ERROR, "{err}");
    let s = ep.stats();
    assert_eq!((s.out_of_slots, s.failed, s.objects), (1, 1, 2));
    // The new object and the two loaded for the command were flushed; nothing was saved.
    let d = delta(&ep, &before);
    assert_eq!(d.describe(1), "CreatePrimary 1, ContextLoad 2, FlushContext 3");
    // ESYS is unusable after a TCTI error (BAD_SEQUENCE); a new context on the same space
    // finds both objects and works.
    drop(ctx);
    let mut ctx = connect(&ep);
    assert_eq!(handles(&ep, 0x8000_0000), vec![0x80FF_FFFE, 0x80FF_FFFF]);
    let obj = ctx
        .execute_without_session(|c| c.tr_from_tpm_public(TpmHandle::try_from(0x80FF_FFFEu32).expect("handle")))
        .expect("ReadPublic");
    ctx.flush_context(obj).expect("flush");
    primary(&mut ctx, ecc_key()).expect("room again");
}

#[test]
fn a_handle_that_is_not_the_spaces_fails_the_command() {
    let f = fixture(Profile::none(), 1.0);
    let ep = f.model.open().expect("endpoint");
    // TPM2_ReadPublic(0x80FFFFFE) with an empty space.
    let cmd = wire::command(wire::ST_NO_SESSIONS, 0x173, &0x80FF_FFFEu32.to_be_bytes());
    assert!(raw(&ep, &cmd).is_none(), "the model must close the connection");
    assert_eq!(ep.stats().failed, 1);
    // A command the TPM does not know gets the resource manager's TPM_RC_COMMAND_CODE.
    let rsp = raw(&ep, &wire::command(wire::ST_NO_SESSIONS, 0x1FFF, &[])).expect("answer");
    assert_eq!(wire::header(&rsp).code, 0xB0143);
    // Permanent handles pass untouched: GetRandom works.
    let rsp = raw(&ep, &wire::command(wire::ST_NO_SESSIONS, cc::GET_RANDOM, &[0, 8])).expect("answer");
    assert_eq!(wire::header(&rsp).code, 0);
}

#[test]
fn sessions_take_slots_are_saved_between_commands_and_flushed_when_the_space_closes() {
    let f = fixture(Profile::none(), 1.0);
    let ep = f.model.open().expect("endpoint");
    let other = f.model.open().expect("endpoint");
    let mut ctx = connect(&ep);
    let start = |ctx: &mut Context| {
        ctx.start_auth_session(
            None,
            None,
            None,
            SessionType::Hmac,
            SymmetricDefinition::AES_128_CFB,
            HashingAlgorithm::Sha256,
        )
    };
    for _ in 0..3 {
        start(&mut ctx).expect("session").expect("a session handle");
    }
    assert_eq!(ep.stats().sessions, 3);
    // Each command loads and saves all three (sessions are not flushed after a command).
    let before = ep.stats().tpm;
    let _ = handles(&ep, 0x8000_0000);
    let d = delta(&ep, &before);
    assert_eq!((d.count(cc::CONTEXT_LOAD), d.count(cc::CONTEXT_SAVE), d.count(cc::FLUSH_CONTEXT)), (3, 3, 0));
    // Three loaded sessions fill the TPM: a fourth fails there (TPM_RC_SESSION_MEMORY).
    let err = start(&mut ctx).expect_err("a fourth session has no room");
    assert_eq!(tss_rc(&err), RC_SESSION_MEMORY, "{err}");

    // Another client sees this space's saved sessions (GetCapability does not filter them,
    // as in the kernel) until the space closes and flushes them.
    assert_eq!(handles(&other, 0x0300_0000).len(), 3);
    let before = ep.stats().tpm;
    ep.close();
    assert_eq!(delta(&ep, &before).count(cc::FLUSH_CONTEXT), 3);
    assert_eq!(handles(&other, 0x0300_0000).len(), 0);
    assert_eq!(ep.stats().sessions, 0);
    // (tss-esapi flushes the sessions it started when the context drops: they are gone.)
    drop(ctx);
}

#[test]
fn a_client_saves_and_loads_its_own_objects() {
    let f = fixture(Profile::none(), 1.0);
    let ep = f.model.open().expect("endpoint");
    let mut ctx = connect(&ep);
    let k = primary(&mut ctx, ecc_key()).expect("key");
    let saved = ctx.context_save(k.into()).expect("ContextSave of a virtual handle");
    ctx.flush_context(k.into()).expect("flush");
    assert_eq!(ep.stats().objects, 0);
    let loaded: ObjectHandle = ctx.context_load(saved).expect("ContextLoad");
    let k = KeyHandle::from(loaded);
    assert_eq!(handles(&ep, 0x8000_0000), vec![0x80FF_FFFF]);
    sign(&mut ctx, k);
    assert_eq!(ep.stats().objects, 1);
}

#[test]
fn commands_take_the_profiles_time_scaled_one_at_a_time() {
    const SPEED: f64 = 0.2;
    let f = fixture(Profile::orin_ftpm(), SPEED);
    let ep = f.model.open().expect("endpoint");
    let mut ctx = connect(&ep);
    let ecc = primary(&mut ctx, ecc_key()).expect("ECC key");
    let created = ep.stats().tpm;
    assert!(created.time() >= Duration::from_secs_f64(0.100 * SPEED), "ECC create {:?}", created.time());

    sign(&mut ctx, ecc); // swtpm's first signature is answered with RETRY
    let before = ep.stats().tpm;
    let t0 = Instant::now();
    sign(&mut ctx, ecc);
    let took = t0.elapsed();
    let d = delta(&ep, &before);
    let floor = Duration::from_secs_f64(0.000_874 * SPEED);
    let ecdsa = Duration::from_secs_f64(0.0451 * SPEED);
    assert_eq!(
        d.describe(1),
        "Sign 1, ContextLoad 1, ContextSave 1, FlushContext 1",
        "client sent {}",
        ep.stats().client.since(&Tally::default()).describe(1)
    );
    assert!(took >= ecdsa + 3 * floor, "ECDSA sign took {took:?}");
    for (code, n, t) in d.iter() {
        let want = if code == cc::SIGN { ecdsa } else { floor };
        assert!(t >= want * n as u32, "{} held {t:?}", wire::command_name(code));
    }

    // RSA: a private op is 11.9 ms, keygen 736 ms (speed-scaled).
    let before = ep.stats().tpm;
    let rsa = primary(&mut ctx, rsa_key()).expect("RSA key");
    let d = delta(&ep, &before);
    assert!(d.time() >= Duration::from_secs_f64(0.7364 * SPEED), "RSA keygen {:?}", d.time());
    let before = ep.stats().tpm;
    sign(&mut ctx, rsa);
    let d = delta(&ep, &before);
    let sign_time = d.iter().find(|(c, _, _)| *c == cc::SIGN).map(|(_, _, t)| t).unwrap_or_default();
    assert!(sign_time >= Duration::from_secs_f64(0.0119 * SPEED) && sign_time < ecdsa, "RSA sign {sign_time:?}");

    // GetRandom: 16 ms per 32 bytes.
    let before = ep.stats().tpm;
    ctx.get_random(64).expect("random");
    let d = delta(&ep, &before);
    let t = d.iter().find(|(c, _, _)| *c == cc::GET_RANDOM).map(|(_, _, t)| t).unwrap_or_default();
    assert!(t >= Duration::from_secs_f64(0.032 * SPEED), "GetRandom(64) {t:?}");
    drop(ctx);

    // Two clients at once: the TPM runs one command at a time, so the wall time is at least
    // the sum of both clients' signatures.
    let (ep1, ep2) = (f.model.open().expect("endpoint"), f.model.open().expect("endpoint"));
    let (mut c1, mut c2) = (connect(&ep1), connect(&ep2));
    let (k1, k2) = (primary(&mut c1, ecc_key()).expect("key"), primary(&mut c2, ecc_key()).expect("key"));
    let t0 = Instant::now();
    let h = std::thread::spawn(move || {
        for _ in 0..3 {
            sign(&mut c1, k1);
        }
    });
    for _ in 0..3 {
        sign(&mut c2, k2);
    }
    h.join().expect("signer");
    assert!(t0.elapsed() >= 6 * ecdsa, "six signatures in {:?}", t0.elapsed());
}

#[test]
fn the_none_profile_adds_no_time_and_stats_are_served() {
    let f = fixture(Profile::none(), 1.0);
    let ep = f.model.open().expect("endpoint");
    let mut ctx = connect(&ep);
    let k = primary(&mut ctx, ecc_key()).expect("key");
    let t0 = Instant::now();
    sign(&mut ctx, k);
    sign(&mut ctx, k);
    sign(&mut ctx, k);
    assert!(t0.elapsed() < Duration::from_millis(3 * 45), "swtpm alone signs in well under the fTPM's 45 ms");
    let stats = tpm_vault_tpm_model::query(f.model.stats_port(), "stats").expect("stats");
    assert_eq!(stats["spaces"][0]["tpm"]["Sign"], 4, "swtpm's first signature is retried once");
    assert_eq!(stats["spaces"][0]["objects"], 1);
    let opened = tpm_vault_tpm_model::query(f.model.stats_port(), "open").expect("open");
    let id = opened["id"].as_u64().expect("id");
    assert!(opened["tcti"].as_str().is_some_and(|t| t.starts_with("swtpm:host=127.0.0.1,port=")));
    let closed = tpm_vault_tpm_model::query(f.model.stats_port(), &format!("close {id}")).expect("close");
    assert_eq!(closed["closed"], id);
}
