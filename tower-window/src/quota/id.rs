//! A quota's id (name and definition) and state id (what a store keys its
//! windows by).

use std::fmt::Write as _;
use std::sync::Arc;

use super::parse::FormatDuration;
use super::{Quota, QuotaError, Scope};

impl Quota {
    /// A stable identifier of this quota's name and definition
    /// (`"<name>|<definition>..."`).
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// The same identifier as a cheaply cloned shared string.
    pub fn shared_id(&self) -> Arc<str> {
        Arc::clone(&self.0.id)
    }

    /// The identity of this quota's state in a store:
    /// `"<name>|<window>|<algorithm>..."`. It leaves out the limit and the
    /// GCRA burst, so changing only those keeps every window; changing
    /// anything else starts fresh ones.
    ///
    /// ```
    /// use tower_window::Quota;
    ///
    /// let old: Quota = "100/1m".parse()?;
    /// let new: Quota = "200/1m".parse()?;
    /// assert_eq!(old.state_id(), new.state_id());
    /// assert_ne!(old.state_id(), "100/1m fixed-window".parse::<Quota>()?.state_id());
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn state_id(&self) -> &str {
        &self.0.state_id
    }

    /// [`state_id`](Self::state_id)'s hash, computed once.
    pub(crate) fn state_id_hash(&self) -> u64 {
        self.0.state_id_hash
    }

    /// The state id as a shared string.
    pub(crate) fn shared_state_id(&self) -> &Arc<str> {
        &self.0.state_id
    }

    /// Computes both ids under `name` from the quota's values.
    pub(super) fn set_ids(&mut self, name: &str) {
        let scope = match self.0.scope {
            Scope::Subject => "",
            Scope::Tenant => "|tenant",
        };
        let generation = match self.0.generation {
            0 => String::new(),
            g => format!("|g{g}"),
        };
        let shadow = if self.0.shadow { "|shadow" } else { "" };
        // The instance goes last in the id, and in the name's place in the
        // state id (`i:` cannot start a name). Escaped, it holds no `|` (ids)
        // or `,` (policy ids) of its own.
        let instance = self.0.instance.as_deref().map(|instance| {
            let mut text = String::with_capacity(instance.len() + 2);
            text.push_str("i:");
            for byte in instance.bytes() {
                if matches!(byte, b'%' | b'|' | b',' | b':') || !(b' '..0x7f).contains(&byte) {
                    let _ = write!(text, "%{byte:02X}");
                } else {
                    text.push(char::from(byte));
                }
            }
            text
        });
        let mut id = format!("{name}|{self}{scope}{generation}{shadow}");
        if let Some(instance) = &instance {
            let _ = write!(id, "|{instance}");
        }
        // Neither the limit, the GCRA burst (not in the algorithm's
        // `Display`) nor the shadow flag: changing them keeps the windows.
        let state_id: Arc<str> = Arc::from(format!(
            "{}|{}|{}{scope}{generation}",
            instance.as_deref().unwrap_or(name),
            FormatDuration(self.window()),
            self.0.algorithm
        ));
        let data = Arc::make_mut(&mut self.0);
        data.name_len = name.len();
        data.state_id_hash = crate::key::state_key::id_hash(&state_id);
        data.id = Arc::from(id);
        data.state_id = state_id;
    }
}

pub(super) fn validate_name(name: &str) -> Result<(), QuotaError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(QuotaError::InvalidName(name.chars().take(80).collect()))
    }
}
