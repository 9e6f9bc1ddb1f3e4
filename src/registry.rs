//! Which message names exist and what their payloads decode into.
//!
//! Events and jobs are registered by name with a `serde` payload type. A
//! stored payload is decoded at delivery; a payload that does not decode is a
//! [`RegistryError::Decode`] (dead-lettered at once), a name nobody
//! registered is a [`RegistryError::UnknownName`] (retried, since a newer
//! worker may know it).
//!
//! A tool that moves messages without knowing their types (the `outbox`
//! command line's `drain`) registers a catch-all with
//! [`RegistryBuilder::any`] instead: names of that kind that have no typed
//! registration then decode into a [`RawMessage`], the payload as stored.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use foldhash::HashMap;
use serde::de::DeserializeOwned;

use crate::error::{ConfigError, Error, RegistryError, Result};
use crate::kind::MessageKind;
use crate::payload::{DecodedPayload, Payload};
use crate::payload::{Event, Job, RawMessage};
use crate::retry::RetryPolicy;

type Decoder = fn(&Payload) -> serde_json::Result<DecodedPayload>;

fn decode_as<T: DeserializeOwned + Send + Sync + 'static>(
    payload: &Payload,
) -> serde_json::Result<DecodedPayload> {
    payload
        .decode::<T>()
        .map(|value| Box::new(value) as Box<dyn Any + Send + Sync>)
}

#[derive(Clone)]
struct Entry {
    type_name: &'static str,
    decode: Decoder,
    retry: Option<RetryPolicy>,
}

/// The registered events and jobs. Cheap to clone.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    events: HashMap<String, Entry>,
    jobs: HashMap<String, Entry>,
    any_events: bool,
    any_jobs: bool,
}

impl Registry {
    /// Start registering.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    fn table(&self, kind: MessageKind) -> &HashMap<String, Entry> {
        match kind {
            MessageKind::Event => &self.inner.events,
            MessageKind::Job => &self.inner.jobs,
        }
    }

    /// Decode a stored payload into the type registered for `kind` and `name`;
    /// a name with no typed registration decodes into a [`RawMessage`] when
    /// `kind` has a catch-all ([`RegistryBuilder::any`]).
    pub fn decode(
        &self,
        kind: MessageKind,
        name: &str,
        payload: &Payload,
    ) -> Result<DecodedPayload, RegistryError> {
        let Some(entry) = self.table(kind).get(name) else {
            if self.catches_all(kind) {
                return Ok(Box::new(RawMessage {
                    kind,
                    name: name.to_owned(),
                    payload: payload.clone(),
                }));
            }
            return Err(RegistryError::UnknownName {
                kind,
                name: name.to_owned(),
            });
        };
        (entry.decode)(payload).map_err(|source| RegistryError::Decode {
            kind,
            name: name.to_owned(),
            type_name: entry.type_name,
            source: Arc::new(source),
        })
    }

    /// `true` when `kind` `name` decodes: registered with a type, or caught
    /// by a catch-all.
    pub fn contains(&self, kind: MessageKind, name: &str) -> bool {
        self.table(kind).contains_key(name) || self.catches_all(kind)
    }

    /// `true` when `kind` has a catch-all ([`RegistryBuilder::any`]).
    pub fn catches_all(&self, kind: MessageKind) -> bool {
        match kind {
            MessageKind::Event => self.inner.any_events,
            MessageKind::Job => self.inner.any_jobs,
        }
    }

    /// The job's own retry policy, if it declares one.
    pub fn retry_policy(&self, kind: MessageKind, name: &str) -> Option<&RetryPolicy> {
        self.table(kind)
            .get(name)
            .and_then(|entry| entry.retry.as_ref())
    }

    /// The names registered with a type for `kind`, sorted (a catch-all has no name).
    pub fn names(&self, kind: MessageKind) -> Vec<&str> {
        let mut names: Vec<_> = self.table(kind).keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// `true` when any event is registered, by type or by a catch-all.
    pub fn has_events(&self) -> bool {
        !self.inner.events.is_empty() || self.inner.any_events
    }

    /// `true` when any job is registered, by type or by a catch-all.
    pub fn has_jobs(&self) -> bool {
        !self.inner.jobs.is_empty() || self.inner.any_jobs
    }

    /// `true` when messages of `kind` are registered, by type or by a catch-all.
    pub fn has(&self, kind: MessageKind) -> bool {
        match kind {
            MessageKind::Event => self.has_events(),
            MessageKind::Job => self.has_jobs(),
        }
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("events", &self.names(MessageKind::Event))
            .field("jobs", &self.names(MessageKind::Job))
            .field("any_events", &self.inner.any_events)
            .field("any_jobs", &self.inner.any_jobs)
            .finish()
    }
}

/// Collects registrations; [`build`](RegistryBuilder::build) reports every
/// problem at once.
#[derive(Default)]
pub struct RegistryBuilder {
    events: HashMap<String, Entry>,
    jobs: HashMap<String, Entry>,
    any_events: bool,
    any_jobs: bool,
    errors: Vec<Error>,
}

impl fmt::Debug for RegistryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder").finish_non_exhaustive()
    }
}

impl RegistryBuilder {
    /// Register event type `E` under `E::NAME`.
    pub fn event<E: Event>(mut self) -> Self {
        let entry = Entry {
            type_name: std::any::type_name::<E>(),
            decode: decode_as::<E>,
            retry: None,
        };
        self.insert(MessageKind::Event, E::NAME, entry);
        self
    }

    /// Register job type `J` under `J::NAME`, with its retry policy.
    pub fn job<J: Job>(mut self) -> Self {
        let retry = J::retry_policy();
        if let Some(policy) = &retry {
            let mut violations = Vec::new();
            policy.check(&mut violations);
            if !violations.is_empty() {
                self.errors.push(ConfigError { violations }.into());
            }
        }
        let entry = Entry {
            type_name: std::any::type_name::<J>(),
            decode: decode_as::<J>,
            retry,
        };
        self.insert(MessageKind::Job, J::NAME, entry);
        self
    }

    /// Accept every `kind` message whose name has no typed registration,
    /// decoding it into a [`RawMessage`] (the payload as stored) instead of
    /// failing with [`RegistryError::UnknownName`]. Typed registrations still
    /// come first.
    ///
    /// For tools that move messages without knowing their types, such as the
    /// `outbox` command line's `drain`. An application should register its
    /// types instead: then a payload that does not fit its type is caught
    /// (and dead-lettered) before it reaches a handler, and a name only a
    /// newer worker knows is left for that worker.
    ///
    /// ```
    /// use outbox::{MessageKind, Payload, RawMessage, Registry};
    ///
    /// let registry = Registry::builder().any(MessageKind::Event).build()?;
    /// let payload = Payload::from_json(r#"{"order_id":7}"#)?;
    /// let decoded = registry.decode(MessageKind::Event, "order.placed", &payload)?;
    /// let raw = decoded.downcast_ref::<RawMessage>().unwrap();
    /// assert_eq!(raw.name, "order.placed");
    /// assert_eq!(raw.payload.as_str(), r#"{"order_id":7}"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn any(mut self, kind: MessageKind) -> Self {
        match kind {
            MessageKind::Event => self.any_events = true,
            MessageKind::Job => self.any_jobs = true,
        }
        self
    }

    fn insert(&mut self, kind: MessageKind, name: &str, entry: Entry) {
        if name.trim().is_empty() {
            self.errors.push(Error::invalid(
                "name",
                format!("{} has an empty {kind} name", entry.type_name),
            ));
            return;
        }
        let table = match kind {
            MessageKind::Event => &mut self.events,
            MessageKind::Job => &mut self.jobs,
        };
        if table.insert(name.to_owned(), entry).is_some() {
            self.errors.push(
                RegistryError::DuplicateName {
                    kind,
                    name: name.to_owned(),
                }
                .into(),
            );
        }
    }

    /// Finish; fails with the first problem found (empty or duplicate names,
    /// invalid job retry policies).
    pub fn build(self) -> Result<Registry> {
        if let Some(error) = self.errors.into_iter().next() {
            return Err(error);
        }
        Ok(Registry {
            inner: Arc::new(Inner {
                events: self.events,
                jobs: self.jobs,
                any_events: self.any_events,
                any_jobs: self.any_jobs,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Placed {
        order: u64,
    }
    impl Event for Placed {
        const NAME: &'static str = "order.placed";
    }

    #[test]
    fn decode_failure_and_unknown_name_are_distinct() {
        let registry = Registry::builder().event::<Placed>().build().unwrap();
        let good = Payload::from_json(r#"{"order":7}"#).unwrap();
        let decoded = registry
            .decode(MessageKind::Event, "order.placed", &good)
            .unwrap();
        assert_eq!(decoded.downcast_ref::<Placed>(), Some(&Placed { order: 7 }));

        let bad = Payload::from_json(r#"{"order":"seven"}"#).unwrap();
        assert!(matches!(
            registry.decode(MessageKind::Event, "order.placed", &bad),
            Err(RegistryError::Decode { .. })
        ));
        assert!(matches!(
            registry.decode(MessageKind::Event, "order.shipped", &good),
            Err(RegistryError::UnknownName { .. })
        ));
        assert!(matches!(
            registry.decode(MessageKind::Job, "order.placed", &good),
            Err(RegistryError::UnknownName { .. })
        ));
    }

    #[test]
    fn a_catch_all_decodes_unknown_names_raw_and_typed_names_first() {
        let registry = Registry::builder()
            .event::<Placed>()
            .any(MessageKind::Event)
            .build()
            .unwrap();
        assert!(registry.catches_all(MessageKind::Event));
        assert!(!registry.catches_all(MessageKind::Job));
        assert!(registry.has_events() && !registry.has_jobs());
        assert!(registry.contains(MessageKind::Event, "order.shipped"));
        assert_eq!(registry.names(MessageKind::Event), ["order.placed"]);

        let good = Payload::from_json(r#"{"order":7}"#).unwrap();
        let typed = registry
            .decode(MessageKind::Event, "order.placed", &good)
            .unwrap();
        assert_eq!(typed.downcast_ref::<Placed>(), Some(&Placed { order: 7 }));

        let raw = registry
            .decode(MessageKind::Event, "order.shipped", &good)
            .unwrap();
        assert_eq!(
            raw.downcast_ref::<RawMessage>(),
            Some(&RawMessage {
                kind: MessageKind::Event,
                name: "order.shipped".to_owned(),
                payload: good.clone(),
            })
        );

        // A typed name whose payload does not fit is still a decode error,
        // never handed on raw; the other kind has no catch-all.
        let bad = Payload::from_json(r#"{"order":"seven"}"#).unwrap();
        assert!(matches!(
            registry.decode(MessageKind::Event, "order.placed", &bad),
            Err(RegistryError::Decode { .. })
        ));
        assert!(matches!(
            registry.decode(MessageKind::Job, "order.shipped", &good),
            Err(RegistryError::UnknownName { .. })
        ));
    }

    #[test]
    fn duplicate_names_are_refused() {
        let error = Registry::builder()
            .event::<Placed>()
            .event::<Placed>()
            .build()
            .unwrap_err();
        assert!(matches!(
            error,
            Error::Registry(RegistryError::DuplicateName { .. })
        ));
    }
}
