//! Event types of the TCG PC Client Platform Firmware Profile (section 10.4.1), their names,
//! and which types' digests are the hash of their own event data.

use std::fmt;

/// An event type (the log's `eventType` field). Unknown values are kept and named
/// `EV_UNKNOWN_0x...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventType(pub u32);

/// Every type the PFP (1.05) names.
const NAMES: &[(u32, &str)] = &[
    (0x0000_0000, "EV_PREBOOT_CERT"),
    (0x0000_0001, "EV_POST_CODE"),
    (0x0000_0002, "EV_UNUSED"),
    (0x0000_0003, "EV_NO_ACTION"),
    (0x0000_0004, "EV_SEPARATOR"),
    (0x0000_0005, "EV_ACTION"),
    (0x0000_0006, "EV_EVENT_TAG"),
    (0x0000_0007, "EV_S_CRTM_CONTENTS"),
    (0x0000_0008, "EV_S_CRTM_VERSION"),
    (0x0000_0009, "EV_CPU_MICROCODE"),
    (0x0000_000a, "EV_PLATFORM_CONFIG_FLAGS"),
    (0x0000_000b, "EV_TABLE_OF_DEVICES"),
    (0x0000_000c, "EV_COMPACT_HASH"),
    (0x0000_000d, "EV_IPL"),
    (0x0000_000e, "EV_IPL_PARTITION_DATA"),
    (0x0000_000f, "EV_NONHOST_CODE"),
    (0x0000_0010, "EV_NONHOST_CONFIG"),
    (0x0000_0011, "EV_NONHOST_INFO"),
    (0x0000_0012, "EV_OMIT_BOOT_DEVICE_EVENTS"),
    (0x0000_0013, "EV_POST_CODE2"),
    (0x8000_0000, "EV_EFI_EVENT_BASE"),
    (0x8000_0001, "EV_EFI_VARIABLE_DRIVER_CONFIG"),
    (0x8000_0002, "EV_EFI_VARIABLE_BOOT"),
    (0x8000_0003, "EV_EFI_BOOT_SERVICES_APPLICATION"),
    (0x8000_0004, "EV_EFI_BOOT_SERVICES_DRIVER"),
    (0x8000_0005, "EV_EFI_RUNTIME_SERVICES_DRIVER"),
    (0x8000_0006, "EV_EFI_GPT_EVENT"),
    (0x8000_0007, "EV_EFI_ACTION"),
    (0x8000_0008, "EV_EFI_PLATFORM_FIRMWARE_BLOB"),
    (0x8000_0009, "EV_EFI_HANDOFF_TABLES"),
    (0x8000_000a, "EV_EFI_PLATFORM_FIRMWARE_BLOB2"),
    (0x8000_000b, "EV_EFI_HANDOFF_TABLES2"),
    (0x8000_000c, "EV_EFI_VARIABLE_BOOT2"),
    (0x8000_000d, "EV_EFI_GPT_EVENT2"),
    (0x8000_0010, "EV_EFI_HCRTM_EVENT"),
    (0x8000_00e0, "EV_EFI_VARIABLE_AUTHORITY"),
    (0x8000_00e1, "EV_EFI_SPDM_FIRMWARE_BLOB"),
    (0x8000_00e2, "EV_EFI_SPDM_FIRMWARE_CONFIG"),
    (0x8000_00e3, "EV_EFI_SPDM_DEVICE_POLICY"),
    (0x8000_00e4, "EV_EFI_SPDM_DEVICE_AUTHORITY"),
];

impl EventType {
    /// EV_NO_ACTION.
    pub const NO_ACTION: EventType = EventType(0x3);
    /// EV_SEPARATOR.
    pub const SEPARATOR: EventType = EventType(0x4);
    /// EV_ACTION.
    pub const ACTION: EventType = EventType(0x5);
    /// EV_S_CRTM_VERSION.
    pub const S_CRTM_VERSION: EventType = EventType(0x8);
    /// EV_IPL.
    pub const IPL: EventType = EventType(0xd);
    /// EV_EFI_VARIABLE_DRIVER_CONFIG.
    pub const EFI_VARIABLE_DRIVER_CONFIG: EventType = EventType(0x8000_0001);
    /// EV_EFI_VARIABLE_BOOT.
    pub const EFI_VARIABLE_BOOT: EventType = EventType(0x8000_0002);
    /// EV_EFI_BOOT_SERVICES_APPLICATION.
    pub const EFI_BOOT_SERVICES_APPLICATION: EventType = EventType(0x8000_0003);
    /// EV_EFI_BOOT_SERVICES_DRIVER.
    pub const EFI_BOOT_SERVICES_DRIVER: EventType = EventType(0x8000_0004);
    /// EV_EFI_RUNTIME_SERVICES_DRIVER.
    pub const EFI_RUNTIME_SERVICES_DRIVER: EventType = EventType(0x8000_0005);
    /// EV_EFI_ACTION.
    pub const EFI_ACTION: EventType = EventType(0x8000_0007);
    /// EV_EFI_PLATFORM_FIRMWARE_BLOB.
    pub const EFI_PLATFORM_FIRMWARE_BLOB: EventType = EventType(0x8000_0008);
    /// EV_EFI_VARIABLE_BOOT2.
    pub const EFI_VARIABLE_BOOT2: EventType = EventType(0x8000_000c);
    /// EV_EFI_VARIABLE_AUTHORITY.
    pub const EFI_VARIABLE_AUTHORITY: EventType = EventType(0x8000_00e0);

    /// The PFP's name, or `EV_UNKNOWN_0x...`.
    pub fn name(self) -> String {
        match NAMES.iter().find(|(value, _)| *value == self.0) {
            Some((_, name)) => (*name).to_owned(),
            None => format!("EV_UNKNOWN_{:#010x}", self.0),
        }
    }

    /// The byte strings one of which the digest of an event of this type with event data
    /// `data` must be the hash of, for the types whose digest the PFP defines as a hash of
    /// the event data; `None` for the others (their digest covers an image, a blob, a table).
    ///
    /// EV_EFI_VARIABLE_BOOT may be the hash of the whole UEFI_VARIABLE_DATA (PFP) or of the
    /// variable's value only (what much firmware does): both are accepted.
    pub(super) fn digest_covers_data(self, data: &[u8]) -> Option<Vec<&[u8]>> {
        match self {
            EventType::SEPARATOR
            | EventType::ACTION
            | EventType::EFI_ACTION
            | EventType::EFI_VARIABLE_DRIVER_CONFIG
            | EventType::EFI_VARIABLE_AUTHORITY
            | EventType::EFI_VARIABLE_BOOT2 => Some(vec![data]),
            EventType::EFI_VARIABLE_BOOT => {
                let value = super::data::variable_value(data);
                Some(std::iter::once(data).chain(value).collect())
            }
            _ => None,
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
