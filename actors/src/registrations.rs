//! The registry a coordinator decodes with, checked against its transports
//! before it starts, or derived from them when none is given.
//!
//! A registered name that no handler serves would burn its attempts on
//! every message; a handler whose name is not registered would never be
//! called; messages registered without a transport would never be
//! delivered. Each is a configuration error found at start, all at once.

use outbox::{
    ConfigError, ConfigViolation, EventBus, JobDispatcher, MessageKind, Registry, RegistryBuilder,
    ServedNames,
};

/// One transport, as the checks see it.
struct Transport {
    kind: MessageKind,
    /// `None` when the coordinator has no transport for this kind.
    served: Option<ServedNames>,
    /// As named in the builder: `event_bus`, `job_dispatcher`.
    field: &'static str,
    /// How a user adds one.
    add: &'static str,
    /// How a user registers a name of this kind.
    register: &'static str,
}

fn transports(events: Option<&dyn EventBus>, jobs: Option<&dyn JobDispatcher>) -> [Transport; 2] {
    [
        Transport {
            kind: MessageKind::Event,
            served: events.map(EventBus::serves),
            field: "event_bus",
            add: "`.event_bus(InProcessBus::new().on(…))`",
            register: "`Registry::builder().event::<T>()`",
        },
        Transport {
            kind: MessageKind::Job,
            served: jobs.map(JobDispatcher::serves),
            field: "job_dispatcher",
            add: "`.job_dispatcher(InProcessJobs::new().on(…))`",
            register: "`Registry::builder().job::<T>()`",
        },
    ]
}

/// The registry to run with: `registry` when given, checked against the
/// transports; else the one the transports' typed handlers describe.
/// Every problem found is listed in one [`ConfigError`].
pub(crate) fn resolve(
    registry: Option<Registry>,
    events: Option<&dyn EventBus>,
    jobs: Option<&dyn JobDispatcher>,
) -> Result<Registry, outbox::Error> {
    let transports = transports(events, jobs);
    let mut violations = Vec::new();
    let registry = match registry {
        Some(registry) => {
            for transport in &transports {
                check(&registry, transport, &mut violations);
            }
            registry
        }
        None => {
            let mut builder = Registry::builder();
            for transport in &transports {
                builder = derive(builder, transport, &mut violations);
            }
            if !violations.is_empty() {
                return Err(ConfigError::new(violations).into());
            }
            return builder.build();
        }
    };
    if violations.is_empty() {
        Ok(registry)
    } else {
        Err(ConfigError::new(violations).into())
    }
}

fn check(registry: &Registry, transport: &Transport, violations: &mut Vec<ConfigViolation>) {
    let kind = transport.kind;
    let Some(served) = &transport.served else {
        if registry.has(kind) {
            let mut names: Vec<String> = registry
                .names(kind)
                .into_iter()
                .map(|name| format!("{name:?}"))
                .collect();
            if registry.catches_all(kind) {
                names.push(format!("any other {kind} (`any`)"));
            }
            violations.push(ConfigViolation::new(
                transport.field,
                format!(
                    "is missing, but {kind}s are registered ({}): add one with {}, or \
                     remove them from the registry",
                    names.join(", "),
                    transport.add
                ),
            ));
        }
        return;
    };
    if !served.is_known() {
        return;
    }
    for name in registry.names(kind) {
        if !served.serves(name) {
            violations.push(ConfigViolation::new(
                "registry",
                format!(
                    "registers {kind} {name:?}, which no handler on the {} serves: add a \
                     handler for it, or remove it from the registry",
                    transport.field
                ),
            ));
        }
    }
    if registry.catches_all(kind) && !served.catches_all() {
        violations.push(ConfigViolation::new(
            "registry",
            format!(
                "accepts any {kind} name (`any`), but the {} has no catch-all handler: \
                 add one with `on_any`, or remove `any({kind_path})` from the registry",
                transport.field,
                kind_path = kind_path(kind)
            ),
        ));
    }
    for name in served.names() {
        if !registry.names(kind).contains(&name) {
            violations.push(ConfigViolation::new(
                transport.field,
                format!(
                    "has a handler for {kind} {name:?}, which is not registered: register \
                     it with {}, or leave the registry out to derive it from the handlers",
                    transport.register
                ),
            ));
        }
    }
}

fn derive(
    mut builder: RegistryBuilder,
    transport: &Transport,
    violations: &mut Vec<ConfigViolation>,
) -> RegistryBuilder {
    let Some(served) = &transport.served else {
        return builder;
    };
    if !served.is_known() {
        violations.push(ConfigViolation::new(
            "registry",
            format!(
                "is missing, and the {} cannot list the {}s it serves: pass \
                 `.registry(…)` naming them",
                transport.field, transport.kind
            ),
        ));
        return builder;
    }
    for name in served.names() {
        match served.registration(name) {
            Some(register) => builder = register(builder),
            None => violations.push(ConfigViolation::new(
                "registry",
                format!(
                    "is missing, and the {} serves {} {name:?} without a type to decode \
                     it into: pass `.registry(…)` registering it",
                    transport.field, transport.kind
                ),
            )),
        }
    }
    if served.catches_all() {
        builder = builder.any(transport.kind);
    }
    builder
}

fn kind_path(kind: MessageKind) -> &'static str {
    match kind {
        MessageKind::Event => "MessageKind::Event",
        MessageKind::Job => "MessageKind::Job",
    }
}
