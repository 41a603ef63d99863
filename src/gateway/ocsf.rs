//! OCSF records in their one-line shorthand.

/// The target OCSF events are logged on; the push layer gives them level `OCSF`.
pub const TARGET: &str = "ocsf";

/// An OCSF event class: its uid, and the shorthand's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub uid: u32,
    pub name: &'static str,
    pub short: &'static str,
}

pub const PROCESS_ACTIVITY: Class = Class {
    uid: 1007,
    name: "Process Activity",
    short: "PROC",
};
pub const SSH_ACTIVITY: Class = Class {
    uid: 4007,
    name: "SSH Activity",
    short: "SSH",
};
pub const CONFIG_STATE_CHANGE: Class = Class {
    uid: 5019,
    name: "Device Config State Change",
    short: "CONFIG",
};

/// An activity of a class (OCSF numbering) with its shorthand name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    pub id: u8,
    pub name: &'static str,
}

impl Activity {
    pub const LAUNCH: Activity = Activity {
        id: 1,
        name: "LAUNCH",
    };
    pub const TERMINATE: Activity = Activity {
        id: 2,
        name: "TERMINATE",
    };
    /// SSH Activity: Refuse.
    pub const REFUSE: Activity = Activity {
        id: 5,
        name: "REFUSE",
    };
}

/// OCSF severity_id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Informational = 1,
    Low = 2,
    Medium = 3,
    High = 4,
    Critical = 5,
}

impl Severity {
    fn short(self) -> &'static str {
        match self {
            Severity::Informational => "INFO",
            Severity::Low => "LOW",
            Severity::Medium => "MED",
            Severity::High => "HIGH",
            Severity::Critical => "CRIT",
        }
    }
}

/// One record. `activity` is the shorthand's second word (for config changes, the
/// state); `action` is `DENIED` for refusals, `FAILED` for failures.
#[derive(Debug, Clone)]
pub struct Event {
    pub class: Class,
    pub activity: &'static str,
    pub activity_id: u8,
    pub severity: Severity,
    pub action: Option<&'static str>,
    pub subject: String,
    pub tags: Vec<String>,
    pub details: Vec<(&'static str, String)>,
}

impl Event {
    pub fn new(class: Class, activity: Activity, severity: Severity) -> Event {
        Event {
            class,
            activity: activity.name,
            activity_id: activity.id,
            severity,
            action: None,
            subject: String::new(),
            tags: Vec::new(),
            details: Vec::new(),
        }
    }

    pub fn process(activity: Activity, severity: Severity) -> Event {
        Event::new(PROCESS_ACTIVITY, activity, severity)
    }

    /// A policy state change: `CONFIG:<STATE>`.
    pub fn config(severity: Severity, state: &'static str) -> Event {
        let mut e = Event::new(
            CONFIG_STATE_CHANGE,
            Activity { id: 1, name: state },
            severity,
        );
        e.activity = state;
        e
    }

    pub fn denied(mut self) -> Event {
        self.action = Some("DENIED");
        self
    }

    pub fn failed(mut self) -> Event {
        self.action = Some("FAILED");
        self
    }

    pub fn subject(mut self, s: String) -> Event {
        self.subject = s;
        self
    }

    /// A bracketed tag after the subject, e.g. `exit:0`.
    pub fn tag(mut self, t: String) -> Event {
        self.tags.push(t);
        self
    }

    pub fn detail(mut self, key: &'static str, value: String) -> Event {
        self.details.push((key, value));
        self
    }

    /// OCSF type_uid: class_uid × 100 + activity_id.
    pub fn type_uid(&self) -> u32 {
        self.class.uid * 100 + u32::from(self.activity_id)
    }

    /// `PROC:TERMINATE [INFO] sh(42) [exit:0] [reason:exited wall_ms:3 ...]`: values with
    /// spaces are quoted.
    pub fn shorthand(&self) -> String {
        let mut s = format!(
            "{}:{} [{}]",
            self.class.short,
            self.activity,
            self.severity.short()
        );
        if let Some(a) = self.action {
            s.push(' ');
            s.push_str(a);
        }
        if !self.subject.is_empty() {
            s.push(' ');
            s.push_str(&self.subject);
        }
        for t in &self.tags {
            s.push_str(&format!(" [{t}]"));
        }
        if !self.details.is_empty() {
            let kv: Vec<String> = self
                .details
                .iter()
                .map(|(k, v)| {
                    if v.contains([' ', ']', '"']) || v.is_empty() {
                        format!("{k}:{v:?}")
                    } else {
                        format!("{k}:{v}")
                    }
                })
                .collect();
            s.push_str(&format!(" [{}]", kv.join(" ")));
        }
        s
    }

    /// Log it on the `ocsf` target; Medium and above at WARN so the console shows it.
    pub fn emit(&self) {
        let line = self.shorthand();
        if self.severity >= Severity::Medium {
            tracing::warn!(target: "ocsf", class_uid = self.class.uid, type_uid = self.type_uid(), "{line}");
        } else {
            tracing::info!(target: "ocsf", class_uid = self.class.uid, type_uid = self.type_uid(), "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthand_has_the_class_prefix_and_quotes_spaces() {
        let e = Event::process(Activity::TERMINATE, Severity::Informational)
            .subject("sh(42)".into())
            .tag("exit:3".into())
            .detail("reason", "exited".into())
            .detail("cmd", "echo hi".into());
        assert_eq!(
            e.shorthand(),
            "PROC:TERMINATE [INFO] sh(42) [exit:3] [reason:exited cmd:\"echo hi\"]"
        );
        assert_eq!(e.type_uid(), 100702);
        let c = Event::config(Severity::High, "FAILED").subject("policy version 3".into());
        assert_eq!(c.shorthand(), "CONFIG:FAILED [HIGH] policy version 3");
        let d = Event::new(SSH_ACTIVITY, Activity::REFUSE, Severity::Medium).denied();
        assert_eq!(d.shorthand(), "SSH:REFUSE [MED] DENIED");
        assert_eq!(d.type_uid(), 400705);
    }
}
