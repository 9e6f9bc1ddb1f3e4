//! The drain configuration's defaults, validation and serialized form.

use super::*;

#[test]
fn defaults_match_the_documented_values() {
    let config = DrainConfig::default();
    assert_eq!(config.batch_size, 100);
    assert_eq!(config.concurrency, 1);
    assert_eq!(config.lease, Duration::from_secs(30));
    assert_eq!(config.heartbeat(), Duration::from_secs(10));
    assert_eq!(config.max_active, Duration::from_secs(300));
    assert_eq!(config.settlement.attempts, 3);
    assert_eq!(config.settlement.delay, Duration::from_millis(100));
    assert_eq!(config.retention.vacuum_after, 10_000);
    config.validate().unwrap();
}

#[test]
fn every_violation_is_reported_with_its_field() {
    let config = DrainConfig {
        batch_size: 0,
        concurrency: 0,
        lease: Duration::from_millis(1),
        max_active: Duration::ZERO,
        settlement: SettlementConfig {
            attempts: 0,
            delay: Duration::from_millis(1),
        },
        ..DrainConfig::default()
    };
    let error = config.validate().unwrap_err();
    for field in [
        "batch_size",
        "concurrency",
        "lease",
        "max_active",
        "settlement.attempts",
    ] {
        assert!(error.names(field), "{field} missing from {error}");
    }
    assert!(
        error.to_string().contains("`lease` must be at least 2ms"),
        "{error}"
    );
}

#[test]
fn a_bad_lease_is_reported_alone_when_the_heartbeat_is_derived() {
    let config = DrainConfig {
        lease: Duration::ZERO,
        ..DrainConfig::default()
    };
    let error = config.validate().unwrap_err();
    assert!(error.names("lease") && !error.names("heartbeat"), "{error}");
}

#[test]
fn concurrency_above_batch_and_heartbeat_not_below_lease_are_refused() {
    let config = DrainConfig {
        batch_size: 10,
        concurrency: 11,
        lease: Duration::from_secs(10),
        heartbeat: Some(Duration::from_secs(10)),
        ..DrainConfig::default()
    };
    let error = config.validate().unwrap_err();
    assert!(
        error.names("concurrency") && error.names("heartbeat"),
        "{error}"
    );
}

#[test]
fn prefetch_and_claims_in_flight_are_sized_by_the_drain_unless_given() {
    let config = DrainConfig::default();
    assert_eq!((config.prefetch, config.claims_in_flight), (None, None));
    let config: DrainConfig =
        serde_json::from_str(r#"{"prefetch": 0, "claims_in_flight": null}"#).unwrap();
    assert_eq!((config.prefetch, config.claims_in_flight), (Some(0), None));
}

#[test]
fn prefetch_is_bounded() {
    let config: DrainConfig = serde_json::from_str(r#"{"prefetch": 4096}"#).unwrap();
    config.validate().unwrap();
    let config = DrainConfig {
        prefetch: Some(4097),
        ..DrainConfig::default()
    };
    let error = config.validate().unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`prefetch` must be at most 4096 (4097 given)"),
        "{error}"
    );
}

#[test]
fn claims_in_flight_is_between_one_and_sixty_four() {
    let config: DrainConfig = serde_json::from_str(r#"{"claims_in_flight": 64}"#).unwrap();
    config.validate().unwrap();
    for given in [0, 65] {
        let config = DrainConfig {
            claims_in_flight: Some(given),
            ..DrainConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert!(
            error.to_string().contains(&format!(
                "`claims_in_flight` must be between 1 and 64 ({given} given)"
            )),
            "{error}"
        );
    }
}

#[test]
fn deserializes_humantime_durations_and_rejects_unknown_fields() {
    let config: DrainConfig = serde_json::from_str(
        r#"{"lease":"1m","heartbeat":"15s","settlement":{"delay":"250ms"},"every":"2s",
            "retry":{"initial_delay":"500ms","max_delay":"1h","max_attempts":7}}"#,
    )
    .unwrap();
    assert_eq!(config.lease, Duration::from_secs(60));
    assert_eq!(config.heartbeat(), Duration::from_secs(15));
    assert_eq!(config.settlement.delay, Duration::from_millis(250));
    assert_eq!(config.settlement.attempts, 3);
    assert_eq!(config.every, Some(Duration::from_secs(2)));
    assert_eq!(config.retry.max_attempts, Some(7));
    config.validate().unwrap();

    let unknown = serde_json::from_str::<DrainConfig>(r#"{"leese":"1m"}"#).unwrap_err();
    assert!(unknown.to_string().contains("leese"), "{unknown}");
    let bad_duration = serde_json::from_str::<DrainConfig>(r#"{"lease":"soon"}"#).unwrap_err();
    assert!(
        bad_duration.to_string().contains("soon") || bad_duration.to_string().contains("unit"),
        "{bad_duration}"
    );
}

#[test]
fn retention_is_validated_with_each_field_named() {
    let config: DrainConfig = serde_json::from_str(
        r#"{"retention":{"delivered":"7d","delete_on_delivery":true,
            "batch_size":0,"every":"0s","dead_lettered":"2y"}}"#,
    )
    .unwrap();
    let error = config.validate().unwrap_err();
    let fields: Vec<&str> = error.violations.iter().map(|v| v.field).collect();
    assert_eq!(
        fields,
        [
            "retention.delete_on_delivery",
            "retention.batch_size",
            "retention.every",
            "retention.dead_lettered",
        ]
    );
    let bad: std::result::Result<DrainConfig, _> =
        serde_json::from_str(r#"{"retention":{"delivered":"a week"}}"#);
    assert!(bad.is_err());
    let on: DrainConfig =
        serde_json::from_str(r#"{"retention":{"delete_on_delivery":true}}"#).unwrap();
    on.validate().unwrap();
    assert_eq!(on.retention.delivered_horizon(), Some(Duration::ZERO));
    assert!(!DrainConfig::default().retention.is_enabled());
}
