//! Retry delays: exponential with jitter ([`Backoff`]), and the session's reconnect policy on
//! top of it ([`Reconnect`]): a session the gateway accepted and kept starts the delays over,
//! and while the gateway still answers `Health` they stay short. Pure: the session loop
//! measures, this decides, so the decisions are tested without a gateway.

use std::time::Duration;

/// Exponential backoff with ±20 % jitter: `base`, doubling up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            next: base,
        }
    }

    pub fn reset(&mut self) {
        self.next = self.base;
    }

    /// The next delay; the jitter keeps a fleet of pods from retrying in lockstep.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_capped(self.max)
    }

    /// The next delay, never above `cap` (before jitter). Doubling goes on from there, so if
    /// a later attempt is not capped the delays keep growing towards `max`.
    pub fn next_delay_capped(&mut self, cap: Duration) -> Duration {
        let d = self.next.min(cap);
        self.next = (d * 2).min(self.max);
        d.mul_f64(0.8 + 0.4 * rand::random::<f64>())
    }
}

/// How long an accepted session must stay up to count as healthy. A gateway that accepts and
/// drops at once (crash loop, a session superseded by a second supervisor with the same
/// sandbox id) then gets the growing delays, not a reconnect every `base`.
pub const STABLE_SESSION: Duration = Duration::from_secs(1);

/// The longest delay while the gateway answers `Health`: it is up and refusing or dropping
/// the session for a reason that may clear at any moment (restarting, the sandbox not yet
/// known, a token being refreshed), and a relay it holds for us waits only 15 s.
pub const HEALTHY_GATEWAY_MAX: Duration = Duration::from_secs(5);

/// What the last attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The gateway accepted the session and kept it for at least [`STABLE_SESSION`].
    Healthy,
    /// The attempt failed, or the session ended sooner. `gateway_up`: the gateway answered
    /// `Health` (HEALTHY) on that connection afterwards, and did not say it was rate limiting.
    Failed { gateway_up: bool },
}

/// The session's reconnect delays.
#[derive(Debug, Clone)]
pub struct Reconnect {
    backoff: Backoff,
    healthy_cap: Duration,
}

impl Reconnect {
    /// `base` and `max` are `--reconnect-base-ms` and `--reconnect-max-ms`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Reconnect {
            backoff: Backoff::new(base, max),
            healthy_cap: HEALTHY_GATEWAY_MAX.clamp(base, max),
        }
    }

    /// The delay before the next attempt.
    pub fn next(&mut self, last: Attempt) -> Duration {
        match last {
            Attempt::Healthy => {
                self.backoff.reset();
                self.backoff.next_delay()
            }
            Attempt::Failed { gateway_up: true } => {
                self.backoff.next_delay_capped(self.healthy_cap)
            }
            Attempt::Failed { gateway_up: false } => self.backoff.next_delay(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(30);

    /// Within the ±20 % jitter of `nominal`.
    fn near(d: Duration, nominal: Duration) -> bool {
        d >= nominal.mul_f64(0.8) && d <= nominal.mul_f64(1.2)
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), MAX);
        let d: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        assert!(near(d[0], Duration::from_secs(1)), "{d:?}");
        assert!(near(d[1], Duration::from_secs(2)), "{d:?}");
        assert!(near(d[7], MAX), "{d:?}");
        b.reset();
        assert!(near(b.next_delay(), Duration::from_secs(1)));
    }

    #[test]
    fn a_healthy_session_starts_the_delays_over_every_time() {
        let mut r = Reconnect::new(BASE, MAX);
        // The gateway was down a while: the delays grew.
        for _ in 0..10 {
            r.next(Attempt::Failed { gateway_up: false });
        }
        // Then one restart after another, each after a session that was accepted and kept:
        // every reconnect comes after the base delay, not 1, 2, 4, 8 s.
        for _ in 0..5 {
            let d = r.next(Attempt::Healthy);
            assert!(near(d, BASE), "{d:?}");
        }
    }

    #[test]
    fn while_the_gateway_answers_health_the_delay_stays_at_most_five_seconds() {
        let mut r = Reconnect::new(BASE, MAX);
        let d: Vec<_> = (0..12)
            .map(|_| r.next(Attempt::Failed { gateway_up: true }))
            .collect();
        assert!(near(d[0], BASE), "{d:?}");
        assert!(
            d.iter().all(|d| *d <= HEALTHY_GATEWAY_MAX.mul_f64(1.2)),
            "{d:?}"
        );
        assert!(near(d[11], HEALTHY_GATEWAY_MAX), "{d:?}");
        // The gateway stops answering: the delays grow on from there to the full cap.
        let d: Vec<_> = (0..6)
            .map(|_| r.next(Attempt::Failed { gateway_up: false }))
            .collect();
        assert!(near(d[0], HEALTHY_GATEWAY_MAX * 2), "{d:?}");
        assert!(near(d[5], MAX), "{d:?}");
    }

    #[test]
    fn the_healthy_cap_never_leaves_the_configured_range() {
        // A test setup's tiny maximum is not raised to five seconds...
        let mut r = Reconnect::new(Duration::from_millis(20), Duration::from_millis(200));
        for _ in 0..10 {
            assert!(r.next(Attempt::Failed { gateway_up: true }) <= Duration::from_millis(240));
        }
        // ...and a base above five seconds is not lowered.
        let mut r = Reconnect::new(Duration::from_secs(8), MAX);
        assert!(near(
            r.next(Attempt::Failed { gateway_up: true }),
            Duration::from_secs(8)
        ));
    }
}
