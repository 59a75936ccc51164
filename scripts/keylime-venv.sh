#!/bin/sh
# Installs Keylime 7.14.3 from PyPI once per machine, for cli/tests/keylime.rs:
#   CACHE/venv-7.14.3   a venv over the system Python (it needs Debian's python3-gpg)
#   CACHE/conf-7.14.3   the default verifier/registrar/tenant/ca/logging/agent configs, made by
#                       keylime_upgrade_config from the templates only the sdist ships
# CACHE defaults to /var/cache/tpm-vault-keylime. Idempotent; a second run does nothing.
set -eu
VERSION=7.14.3
CACHE=${1:-${TPM_VAULT_KEYLIME_CACHE:-/var/cache/tpm-vault-keylime}}
VENV=$CACHE/venv-$VERSION
CONF=$CACHE/conf-$VERSION
[ -x "$VENV/bin/keylime_verifier" ] && [ -f "$CONF/verifier.conf" ] && exit 0
/usr/bin/python3 -c 'import gpg' 2>/dev/null || { echo "keylime-venv.sh: install python3-gpg (apt-get install python3-gpg)" >&2; exit 1; }
mkdir -p "$CACHE"
TMP=$(mktemp -d "$CACHE/.install-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
rm -rf "$VENV" "$CONF"
/usr/bin/python3 -m venv --system-site-packages "$VENV"
# The wheel declares no dependencies: these are what the verifier, registrar and tenant import.
"$VENV/bin/pip" install -q "keylime==$VERSION" jinja2 alembic cryptography jsonschema lark packaging \
    psutil pyasn1 pyasn1-modules requests sqlalchemy tornado pyyaml rfc3161ng
"$VENV/bin/pip" download -q --no-binary :all: --no-deps "keylime==$VERSION" -d "$TMP/sdist"
tar xzf "$TMP/sdist/keylime-$VERSION.tar.gz" -C "$TMP/sdist"
mkdir -p "$TMP/conf"
"$VENV/bin/keylime_upgrade_config" --defaults --out "$TMP/conf" --templates "$TMP/sdist/keylime-$VERSION/templates" >/dev/null 2>&1
[ -f "$TMP/conf/verifier.conf" ] || { echo "keylime-venv.sh: keylime_upgrade_config wrote no configs" >&2; exit 1; }
mv "$TMP/conf" "$CONF"
echo "keylime-venv.sh: Keylime $VERSION in $VENV, configs in $CONF"
