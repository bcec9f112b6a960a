//! One guess per code: the responder never sends anything a guess could be checked against before it has
//! verified the initiator's confirmation, and a shared [`CodeAttempts`] budget ends a code after one wrong
//! confirmation (or a few attempts that reached the PAKE and did not finish), even across concurrent handshakes.

use std::sync::Arc;

use ferry_channel::{Auth, ChannelError, CodeAttempts, Handshake, MAX_FAILED_ATTEMPTS};

use crate::common::*;

/// An attacker (the initiator) that runs the PAKE and hangs up before sending its own confirmation; everything
/// the responder ever sent is delivered to the attacker. Returns the attacker's confirmation, never sent.
fn guess_and_hang_up(attacker: &mut Handshake, responder: &mut Handshake) -> Vec<u8> {
    loop {
        let to_b = attacker.take_output();
        if !to_b.is_empty() {
            responder
                .feed(&to_b)
                .expect("responder takes the attacker's bytes");
        }
        let to_a = responder.take_output();
        if to_b.is_empty() && to_a.is_empty() {
            return Vec::new();
        }
        if !to_a.is_empty() && attacker.feed(&to_a).is_err() {
            return Vec::new();
        }
        if attacker.attempt_charged() {
            // The attacker has the responder's PAKE message and has queued its confirmation after its own
            // version packet (which carries its PAKE message): it sends everything but the confirmation,
            // hangs up, and reads whatever the responder still sends.
            let (flight, confirmation) = split_confirmation(attacker.take_output());
            responder
                .feed(&flight)
                .expect("responder takes the attacker's PAKE message");
            let rest = responder.take_output();
            if !rest.is_empty() {
                let _ = attacker.feed(&rest);
            }
            return confirmation;
        }
    }
}

#[test]
fn a_guess_that_hangs_up_before_confirming_gets_nothing_to_check() {
    // The attacker even holds the right code: if the responder's confirmation reached it, its handshake would
    // finish, which is exactly the offline check of a guess.
    let mut attacker = initiator(aes_config(), code());
    let mut sender = responder(aes_config(), code());
    guess_and_hang_up(&mut attacker, &mut sender);
    assert!(
        attacker.attempt_charged(),
        "the attacker got as far as the PAKE"
    );
    assert!(
        !attacker.is_done(),
        "the responder sent its key confirmation before verifying the initiator's"
    );
    assert!(!sender.is_done());
}

#[test]
fn hang_ups_after_the_pake_count_and_end_the_code_at_the_limit() {
    let budget = CodeAttempts::one_guess(MAX_FAILED_ATTEMPTS);
    for i in 1..MAX_FAILED_ATTEMPTS {
        let mut attacker = initiator(aes_config(), Auth::Code(b"7-wrong-guess-here".to_vec()));
        let mut sender = responder(aes_config(), code()).with_attempts(Arc::clone(&budget));
        guess_and_hang_up(&mut attacker, &mut sender);
        assert!(sender.attempt_charged());
        drop(sender);
        assert_eq!(budget.failed(), i);
        assert!(!budget.is_dead(), "only {i} attempts failed");
    }
    // Below the limit the right code still works, and a finished attempt costs nothing.
    {
        let mut a = initiator(aes_config(), code());
        let mut b = responder(aes_config(), code()).with_attempts(Arc::clone(&budget));
        let (ea, eb) = pump(&mut a, &mut b, |_, bytes| bytes);
        settle(a, ea).expect("the right code completes");
        settle(b, eb).expect("the right code completes");
        assert_eq!(budget.failed(), MAX_FAILED_ATTEMPTS - 1);
    }
    let mut attacker = initiator(aes_config(), Auth::Code(b"7-wrong-guess-here".to_vec()));
    let mut sender = responder(aes_config(), code()).with_attempts(Arc::clone(&budget));
    guess_and_hang_up(&mut attacker, &mut sender);
    drop(sender);
    assert!(budget.is_dead(), "the code is dead after the limit");

    // A dead code refuses even the right code, before any confirmation is checked.
    let mut a = initiator(aes_config(), code());
    let mut b = responder(aes_config(), code()).with_attempts(Arc::clone(&budget));
    let (ea, eb) = pump(&mut a, &mut b, |_, bytes| bytes);
    assert!(matches!(eb, Some(ChannelError::WrongCode)), "{eb:?}");
    assert!(
        matches!(settle(a, ea), Err(ChannelError::WrongCode)),
        "the initiator is told why"
    );
}

#[test]
fn one_wrong_confirmation_ends_the_code_for_the_sender() {
    let budget = CodeAttempts::one_guess(MAX_FAILED_ATTEMPTS);
    let mut a = initiator(aes_config(), Auth::Code(b"7-amber-otter-viola".to_vec()));
    let mut b = responder(aes_config(), code()).with_attempts(Arc::clone(&budget));
    let (ea, eb) = pump(&mut a, &mut b, |_, bytes| bytes);
    assert!(matches!(ea, Some(ChannelError::WrongCode)), "{ea:?}");
    assert!(matches!(eb, Some(ChannelError::WrongCode)), "{eb:?}");
    assert!(budget.is_dead());
    assert_eq!(budget.failed(), 1);
}

#[test]
fn concurrent_wrong_guesses_are_checked_one_at_a_time_and_only_once() {
    // Eight attackers run their handshakes side by side up to the point where their confirmations arrive. The
    // first wrong one kills the code; the other seven are refused without being checked.
    let budget = CodeAttempts::one_guess(MAX_FAILED_ATTEMPTS);
    let mut pairs: Vec<(Handshake, Handshake)> = (0..8)
        .map(|i| {
            let guess = format!("7-wrong-guess-{i}").into_bytes();
            (
                initiator(aes_config(), Auth::Code(guess)),
                responder(aes_config(), code()).with_attempts(Arc::clone(&budget)),
            )
        })
        .collect();
    // Run every pair until each attacker holds its wrong confirmation, undelivered.
    let held: Vec<Vec<u8>> = pairs
        .iter_mut()
        .map(|(a, b)| {
            let confirmation = guess_and_hang_up(a, b);
            assert!(b.attempt_charged() && !confirmation.is_empty());
            confirmation
        })
        .collect();
    // Now all eight confirmations arrive at once, on eight threads.
    let errors: Vec<Option<ChannelError>> = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .into_iter()
            .zip(held)
            .map(|((_, mut b), confirmation)| s.spawn(move || b.feed(&confirmation).err()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    assert!(budget.is_dead());
    assert_eq!(
        budget.failed(),
        1,
        "only the first wrong confirmation may be checked; the others arrive at a dead code"
    );
    assert!(
        errors
            .iter()
            .all(|e| matches!(e, Some(ChannelError::WrongCode))),
        "{errors:?}"
    );
}

#[test]
fn the_receivers_budget_ends_after_the_limit_of_failed_attempts() {
    // The initiator confirms first, so each failed attempt gave its peer one guess: at most the limit.
    let budget = CodeAttempts::at_most(MAX_FAILED_ATTEMPTS);
    for i in 1..=MAX_FAILED_ATTEMPTS {
        let mut a = initiator(aes_config(), code()).with_attempts(Arc::clone(&budget));
        let mut spoofer = responder(aes_config(), Auth::Code(b"7-spoofer-guess-x".to_vec()));
        let (ea, _) = pump(&mut a, &mut spoofer, |_, bytes| bytes);
        assert!(matches!(ea, Some(ChannelError::WrongCode)), "{ea:?}");
        assert_eq!(budget.failed(), i);
    }
    assert!(budget.is_dead());
    let mut a = initiator(aes_config(), code()).with_attempts(Arc::clone(&budget));
    let mut b = responder(aes_config(), code());
    let (ea, _) = pump(&mut a, &mut b, |_, bytes| bytes);
    assert!(
        matches!(ea, Some(ChannelError::WrongCode)),
        "a dead budget sends no further confirmation: {ea:?}"
    );
}
