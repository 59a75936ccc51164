//! Command counts: per command code, the number of commands and the time the TPM was held
//! for them, per client space and for the whole TPM. Owns no I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::wire::command_name;

/// Commands counted, by command code: (count, time the TPM was held for them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    by_code: BTreeMap<u32, (u64, Duration)>,
}

impl Tally {
    /// Counts one command.
    pub fn add(&mut self, code: u32, took: Duration) {
        let e = self.by_code.entry(code).or_default();
        e.0 += 1;
        e.1 += took;
    }

    /// What was counted after `earlier` (a snapshot of the same counter).
    pub fn since(&self, earlier: &Tally) -> Tally {
        let mut by_code = BTreeMap::new();
        for (&code, &(n, t)) in &self.by_code {
            let (n0, t0) = earlier.by_code.get(&code).copied().unwrap_or_default();
            if n > n0 {
                by_code.insert(code, (n - n0, t.saturating_sub(t0)));
            }
        }
        Tally { by_code }
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Tally) {
        for (&code, &(n, t)) in &other.by_code {
            let e = self.by_code.entry(code).or_default();
            e.0 += n;
            e.1 += t;
        }
    }

    /// Commands in all.
    pub fn commands(&self) -> u64 {
        self.by_code.values().map(|(n, _)| n).sum()
    }

    /// Time the TPM was held, summed over the commands.
    pub fn time(&self) -> Duration {
        self.by_code.values().map(|(_, t)| *t).sum()
    }

    /// Commands with this code.
    pub fn count(&self, code: u32) -> u64 {
        self.by_code.get(&code).map_or(0, |(n, _)| *n)
    }

    /// (code, count, time) in command-code order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u64, Duration)> + '_ {
        self.by_code.iter().map(|(&c, &(n, t))| (c, n, t))
    }

    /// `ContextLoad 1, Sign 1` per operation (counts divided by `ops`, in command-code
    /// order); `none` when nothing was counted.
    pub fn describe(&self, ops: u64) -> String {
        if self.by_code.is_empty() {
            return "none".into();
        }
        let ops = ops.max(1) as f64;
        self.by_code
            .iter()
            .map(|(&code, &(n, _))| {
                let per = n as f64 / ops;
                let per = if (per - per.round()).abs() < 0.005 { format!("{per:.0}") } else { format!("{per:.2}") };
                format!("{} {per}", command_name(code))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `{"Sign": 3, ...}` as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> =
            self.by_code.iter().map(|(&c, &(n, _))| (command_name(c), serde_json::Value::from(n))).collect();
        serde_json::Value::Object(map)
    }
}

/// One client space's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// The space's number (in the order spaces were opened, from 1).
    pub id: u64,
    /// Its data port (the control port is the next one).
    pub port: u16,
    /// Still open.
    pub open: bool,
    /// The commands the client sent.
    pub client: Tally,
    /// The commands that reached the TPM on its behalf (the client's and the resource
    /// manager's ContextLoad, ContextSave and FlushContext).
    pub tpm: Tally,
    /// Commands that failed because the space had no free object or session slot.
    pub out_of_slots: u64,
    /// Commands that failed for any reason the resource manager itself gives (out of slots
    /// included): what `write()` on `/dev/tpmrm0` would have returned an error for.
    pub failed: u64,
    /// Objects saved in the space now.
    pub objects: usize,
    /// Sessions in the space now.
    pub sessions: usize,
}

impl SpaceStats {
    /// As JSON (the stats port's answer).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "port": self.port,
            "open": self.open,
            "client": self.client.to_json(),
            "tpm": self.tpm.to_json(),
            "client_commands": self.client.commands(),
            "tpm_commands": self.tpm.commands(),
            "out_of_slots": self.out_of_slots,
            "failed": self.failed,
            "objects": self.objects,
            "sessions": self.sessions,
        })
    }
}

/// The whole model's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Every command that reached the TPM, for all clients.
    pub tpm: Tally,
    /// Every client space ever opened.
    pub spaces: Vec<SpaceStats>,
}

impl Stats {
    /// As JSON (the stats port's answer).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "tpm": self.tpm.to_json(),
            "tpm_commands": self.tpm.commands(),
            "tpm_busy_ms": self.tpm.time().as_secs_f64() * 1e3,
            "spaces": self.spaces.iter().map(SpaceStats::to_json).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_subtract_merge_and_describe() {
        let ms = Duration::from_millis;
        let mut a = Tally::default();
        a.add(0x17E, ms(1));
        let before = a.clone();
        for _ in 0..2 {
            a.add(0x17E, ms(1));
            a.add(0x158, ms(3));
        }
        let d = a.since(&before);
        assert_eq!(d.commands(), 4);
        assert_eq!(d.time(), ms(8));
        assert_eq!(d.count(0x158), 2);
        assert_eq!(d.describe(2), "Quote 1, PCR_Read 1");
        let mut m = d.clone();
        m.merge(&d);
        assert_eq!(m.count(0x17E), 4);
        assert_eq!(Tally::default().describe(1), "none");
        assert_eq!(d.to_json()["Quote"], 2);
    }
}
