//! Decoding event data: text, UEFI variables (`UEFI_VARIABLE_DATA`), image loads
//! (`UEFI_IMAGE_LOAD_EVENT` with its device path), firmware blobs, separators and the
//! EV_NO_ACTION headers (Spec ID, StartupLocality).
//!
//! Decoding never fails: data that does not parse as its type says is kept raw
//! ([`EventData::Raw`]). Every length is checked against the data before use.

use std::fmt;

use super::EventType;

/// Signature of the EV_NO_ACTION event that sets PCR 0's initial value.
pub(super) const STARTUP_LOCALITY: &[u8; 16] = b"StartupLocality\0";

/// Event data, decoded as far as its type says how.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventData {
    /// Text (UTF-8, ASCII or UTF-16LE in the log; trailing NULs dropped).
    Text(String),
    /// EV_SEPARATOR's value: 0 normally, 0xFFFFFFFF when the firmware hit an error.
    Separator(u32),
    /// An EV_NO_ACTION header event: `Spec ID Event03` (the crypto-agile header) and the like.
    Signature(String),
    /// The StartupLocality EV_NO_ACTION event: the locality the TPM was started from, which
    /// is PCR 0's initial value's last byte.
    StartupLocality(u8),
    /// A UEFI variable (`UEFI_VARIABLE_DATA`).
    UefiVariable {
        /// Vendor GUID, e.g. `8be4df61-93ca-11d2-aa0d-00e098032b8c` (EFI global variables).
        guid: String,
        /// Variable name, e.g. `SecureBoot`, `Boot0001`, `db`.
        name: String,
        /// The variable's value.
        value: Vec<u8>,
    },
    /// An image load (`UEFI_IMAGE_LOAD_EVENT`): boot loaders, drivers.
    ImageLoad {
        /// ImageLocationInMemory.
        address: u64,
        /// ImageLengthInMemory.
        length: u64,
        /// ImageLinkTimeAddress.
        link_time_address: u64,
        /// The device path of the image.
        device_path: Vec<DevicePathNode>,
    },
    /// A firmware blob (`UEFI_PLATFORM_FIRMWARE_BLOB`): where in memory the measured code was.
    FirmwareBlob {
        /// BlobBase.
        base: u64,
        /// BlobLength.
        length: u64,
    },
    /// Data this module does not decode.
    Raw(Vec<u8>),
}

/// One node of a UEFI device path, in the UEFI spec's text form (`PciRoot(0x0)`,
/// `HD(1,GPT,...)`, `\EFI\BOOT\BOOTX64.EFI`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePathNode {
    /// Type (1 hardware, 2 ACPI, 3 messaging, 4 media, 5 BIOS boot, 0x7f end).
    pub kind: u8,
    /// Sub-type.
    pub subtype: u8,
    /// Its text form.
    pub text: String,
}

impl EventData {
    /// Decodes the data of an event of type `event_type`.
    pub fn decode(event_type: EventType, data: &[u8]) -> EventData {
        let decoded = match event_type {
            EventType::NO_ACTION => no_action(data),
            EventType::SEPARATOR => <[u8; 4]>::try_from(data).ok().map(|b| EventData::Separator(u32::from_le_bytes(b))),
            EventType::EFI_VARIABLE_DRIVER_CONFIG
            | EventType::EFI_VARIABLE_BOOT
            | EventType::EFI_VARIABLE_BOOT2
            | EventType::EFI_VARIABLE_AUTHORITY => uefi_variable(data),
            EventType::EFI_BOOT_SERVICES_APPLICATION
            | EventType::EFI_BOOT_SERVICES_DRIVER
            | EventType::EFI_RUNTIME_SERVICES_DRIVER => image_load(data),
            EventType::EFI_PLATFORM_FIRMWARE_BLOB => firmware_blob(data),
            EventType(0x1 | 0x5 | 0x8 | 0xa | 0xc | 0xd | 0x12 | 0x13) | EventType::EFI_ACTION => text(data),
            _ => None,
        };
        decoded.unwrap_or_else(|| EventData::Raw(data.to_vec()))
    }

    /// The device path as one string (`PciRoot(0x0)/Pci(0x1,0x1)/.../\EFI\x.efi`), for image loads.
    pub fn device_path_text(nodes: &[DevicePathNode]) -> String {
        let mut out = String::new();
        for node in nodes {
            if !out.is_empty() && !node.text.is_empty() && node.text != "," {
                out.push('/');
            }
            out.push_str(&node.text);
        }
        out
    }
}

impl fmt::Display for EventData {
    /// One line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventData::Text(text) => write!(f, "{text:?}"),
            EventData::Separator(value) => write!(f, "separator {value:#010x}"),
            EventData::Signature(signature) => write!(f, "{signature:?}"),
            EventData::StartupLocality(locality) => write!(f, "StartupLocality {locality}"),
            EventData::UefiVariable { guid, name, value } => {
                write!(f, "variable {guid}:{} ({} bytes)", escape_text(name), value.len())
            }
            EventData::ImageLoad { length, device_path, .. } => {
                write!(f, "image {} ({length} bytes)", escape_text(&EventData::device_path_text(device_path)))
            }
            EventData::FirmwareBlob { base, length } => write!(f, "firmware blob at {base:#x}, {length} bytes"),
            EventData::Raw(data) if data.len() <= 64 => write!(f, "{}", hex::encode(data)),
            EventData::Raw(data) => write!(f, "{}... ({} bytes)", hex::encode(&data[..64]), data.len()),
        }
    }
}

/// `text` for a terminal: control characters (C0 incl. ESC, DEL, C1) and the bidirectional
/// overrides become `\x1b` / `\u{9b}` escapes, so a hostile log cannot drive the terminal
/// that shows it; other printable Unicode is kept as is.
pub(crate) fn escape_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            let code = u32::from(c);
            if code < 0x80 {
                out.push_str(&format!("\\x{code:02x}"));
            } else {
                out.push_str(&format!("\\u{{{code:x}}}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// EV_NO_ACTION: a signature (Spec ID, StartupLocality, ...), or raw.
fn no_action(data: &[u8]) -> Option<EventData> {
    if let Some(rest) = data.strip_prefix(STARTUP_LOCALITY) {
        return rest.first().map(|&locality| EventData::StartupLocality(locality));
    }
    let signature = data.get(..16)?;
    let end = signature.iter().position(|&b| b == 0).unwrap_or(16);
    let text = std::str::from_utf8(&signature[..end]).ok().filter(|t| !t.is_empty() && is_printable(t))?;
    Some(EventData::Signature(text.to_owned()))
}

/// Text in UTF-8 (or ASCII) or, failing that, UTF-16LE; trailing NULs dropped.
fn text(data: &[u8]) -> Option<EventData> {
    let trimmed = trim_nuls(data);
    if let Some(text) = std::str::from_utf8(trimmed).ok().filter(|t| is_printable(t)) {
        return Some(EventData::Text(text.to_owned()));
    }
    let text = utf16(data)?;
    let text = text.trim_end_matches('\0');
    is_printable(text).then(|| EventData::Text(text.to_owned()))
}

fn trim_nuls(data: &[u8]) -> &[u8] {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1);
    &data[..end]
}

fn is_printable(text: &str) -> bool {
    text.chars().all(|c| !c.is_control() || c == '\n' || c == '\t' || c == '\r')
}

/// UTF-16LE, if `data` has an even length and decodes.
fn utf16(data: &[u8]) -> Option<String> {
    if !data.len().is_multiple_of(2) {
        return None;
    }
    let units: Vec<u16> = data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    String::from_utf16(&units).ok()
}

/// A little-endian u64 at `at`.
fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    let bytes = data.get(at..at.checked_add(8)?)?;
    let mut b = [0u8; 8];
    b.copy_from_slice(bytes);
    Some(u64::from_le_bytes(b))
}

/// A GUID (EFI_GUID, the first three fields little-endian) at the start of `data`.
fn guid(data: &[u8]) -> Option<String> {
    let g = data.get(..16)?;
    Some(format!(
        "{:08x}-{:04x}-{:04x}-{}-{}",
        u32::from_le_bytes([g[0], g[1], g[2], g[3]]),
        u16::from_le_bytes([g[4], g[5]]),
        u16::from_le_bytes([g[6], g[7]]),
        hex::encode(&g[8..10]),
        hex::encode(&g[10..16])
    ))
}

/// `UEFI_VARIABLE_DATA`: VariableName (GUID), UnicodeNameLength and VariableDataLength (u64),
/// UnicodeName (CHAR16, not terminated), VariableData. Returns the name and the value's range.
fn variable_parts(data: &[u8]) -> Option<(String, String, &[u8])> {
    let vendor = guid(data)?;
    let name_chars = u64_at(data, 16)?;
    let value_len = u64_at(data, 24)?;
    let name_len = usize::try_from(name_chars).ok()?.checked_mul(2)?;
    let name_end = 32usize.checked_add(name_len)?;
    let name = utf16(data.get(32..name_end)?)?;
    let value_end = name_end.checked_add(usize::try_from(value_len).ok()?)?;
    let value = data.get(name_end..value_end)?;
    Some((vendor, name, value))
}

fn uefi_variable(data: &[u8]) -> Option<EventData> {
    let (guid, name, value) = variable_parts(data)?;
    Some(EventData::UefiVariable { guid, name, value: value.to_vec() })
}

/// The value of a `UEFI_VARIABLE_DATA`, if it parses.
pub(super) fn variable_value(data: &[u8]) -> Option<&[u8]> {
    variable_parts(data).map(|(_, _, value)| value)
}

/// `UEFI_IMAGE_LOAD_EVENT`: three u64 addresses and lengths, LengthOfDevicePath, DevicePath.
fn image_load(data: &[u8]) -> Option<EventData> {
    let address = u64_at(data, 0)?;
    let length = u64_at(data, 8)?;
    let link_time_address = u64_at(data, 16)?;
    let path_len = usize::try_from(u64_at(data, 24)?).ok()?;
    let path = data.get(32..32usize.checked_add(path_len)?)?;
    Some(EventData::ImageLoad { address, length, link_time_address, device_path: device_path(path) })
}

/// `UEFI_PLATFORM_FIRMWARE_BLOB`: BlobBase, BlobLength.
fn firmware_blob(data: &[u8]) -> Option<EventData> {
    if data.len() != 16 {
        return None;
    }
    Some(EventData::FirmwareBlob { base: u64_at(data, 0)?, length: u64_at(data, 8)? })
}

/// The nodes of a device path (each: type, sub-type, u16 length including this header, data),
/// up to the end node or the first node that does not fit (kept as a raw node).
fn device_path(mut path: &[u8]) -> Vec<DevicePathNode> {
    let mut nodes = Vec::new();
    while path.len() >= 4 {
        let (kind, subtype) = (path[0], path[1]);
        let len = usize::from(u16::from_le_bytes([path[2], path[3]]));
        if len < 4 || len > path.len() {
            nodes.push(DevicePathNode { kind, subtype, text: format!("Invalid({})", hex::encode(path)) });
            break;
        }
        let body = &path[4..len];
        if kind == 0x7f && subtype == 0xff {
            break;
        }
        nodes.push(DevicePathNode { kind, subtype, text: node_text(kind, subtype, body) });
        path = &path[len..];
    }
    nodes
}

/// The UEFI spec's text form of the common nodes; `Path(type,subtype,hex)` for the others.
fn node_text(kind: u8, subtype: u8, body: &[u8]) -> String {
    let u32_at = |at: usize| body.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let known = match (kind, subtype) {
        (0x01, 0x01) if body.len() == 2 => Some(format!("Pci({:#x},{:#x})", body[1], body[0])),
        (0x02, 0x01) if body.len() == 8 => match (u32_at(0), u32_at(4)) {
            (Some(0x0a03_41d0), Some(uid)) => Some(format!("PciRoot({uid:#x})")),
            (Some(0x0a08_41d0), Some(uid)) => Some(format!("PcieRoot({uid:#x})")),
            (Some(hid), Some(uid)) => Some(format!("Acpi({hid:#010x},{uid:#x})")),
            _ => None,
        },
        (0x03, 0x05) if body.len() == 2 => Some(format!("USB({:#x},{:#x})", body[0], body[1])),
        (0x03, 0x12) if body.len() == 6 => {
            Some(format!("Sata({:#x},{:#x},{:#x})", u16_le(body, 0), u16_le(body, 2), u16_le(body, 4)))
        }
        (0x03, 0x17) if body.len() == 12 => u32_at(0).map(|ns| format!("NVMe({ns:#x},{})", hex::encode(&body[4..]))),
        (0x04, 0x01) if body.len() == 38 => hard_drive(body),
        (0x04, 0x04) => utf16(body).map(|path| path.trim_end_matches('\0').to_owned()),
        (0x04, 0x06) => guid(body).map(|g| format!("FvFile({g})")),
        (0x04, 0x07) => guid(body).map(|g| format!("Fv({g})")),
        (0x7f, 0x01) => Some(",".to_owned()),
        _ => None,
    };
    known.unwrap_or_else(|| format!("Path({kind},{subtype},{})", hex::encode(body)))
}

fn u16_le(body: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([body[at], body[at + 1]])
}

/// `HD(partition,GPT|MBR,signature,start,size)`.
fn hard_drive(body: &[u8]) -> Option<String> {
    let partition = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    let start = u64_at(body, 4)?;
    let size = u64_at(body, 12)?;
    let signature = body.get(20..36)?;
    let (format, sig_type) = (body[36], body[37]);
    let sig = match sig_type {
        2 => guid(signature)?,
        1 => format!("{:#010x}", u32::from_le_bytes([signature[0], signature[1], signature[2], signature[3]])),
        _ => "0".to_owned(),
    };
    let format = if format == 2 { "GPT" } else { "MBR" };
    Some(format!("HD({partition},{format},{sig},{start:#x},{size:#x})"))
}
