package render

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// MaxNameLength is the longest name of a node, jail, replica, volume,
// Service or Ingress: a DNS label, since names become jail names, ZFS
// dataset components, directory names and argv elements.
const MaxNameLength = 63

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	envName      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelName    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValue   = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	imageSegment = regexp.MustCompile(`^[a-z0-9][-a-z0-9._]*$`)
	bridgeName   = regexp.MustCompile(`^keel[0-9]{1,4}$`)
	poolName     = regexp.MustCompile(`^[A-Za-z][-A-Za-z0-9_.:]*$`)
	emailLocal   = regexp.MustCompile(`^[A-Za-z0-9.!#$%&'*+/=?^_` + "`" + `{|}~-]+$`)
	semver       = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
)

// checkName reports why name is not a valid object name, or "" when it is.
func checkName(name string) string {
	switch {
	case name == "":
		return "a name is required"
	case len(name) > MaxNameLength:
		return fmt.Sprintf("%q is longer than %d characters", name, MaxNameLength)
	case !dnsLabel.MatchString(name):
		return fmt.Sprintf("%q is not a valid name (lowercase letters, digits and '-', starting and ending with a letter or digit)", name)
	}
	return ""
}

// checkLabelKey validates a label key: an optional DNS-subdomain prefix and a
// slash, then a name of at most 63 characters (keel.dev/ingress, tier).
func checkLabelKey(key string) string {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix && checkHostname(prefix, false) != "" {
		return fmt.Sprintf("label key %q: the prefix before '/' must be a DNS name", key)
	}
	if name == "" || len(name) > 63 || !labelName.MatchString(name) {
		return fmt.Sprintf("label key %q is not valid (at most 63 letters, digits, '-', '_' or '.', after an optional DNS prefix and '/')", key)
	}
	return ""
}

func checkLabelValue(v string) string {
	if len(v) > 63 || !labelValue.MatchString(v) {
		return fmt.Sprintf("label value %q is not valid (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)", v)
	}
	return ""
}

// checkHostname validates a DNS name; needDot requires at least two labels.
func checkHostname(host string, needDot bool) string {
	if host == "" {
		return "a host name is required"
	}
	if len(host) > 253 {
		return fmt.Sprintf("%q is longer than 253 characters", host)
	}
	labels := strings.Split(host, ".")
	if needDot && len(labels) < 2 {
		return fmt.Sprintf("%q is not a fully qualified host name (want e.g. app.example.com)", host)
	}
	for _, l := range labels {
		if len(l) > 63 || !dnsLabel.MatchString(l) {
			return fmt.Sprintf("%q is not a valid host name (lowercase letters, digits, '-' and dots)", host)
		}
	}
	return ""
}

// checkImage validates an image name. It becomes a ZFS dataset under
// <pool>/keel/ on FreeBSD and a directory under the state directory for the
// process driver, so it must stay inside base/ and never climb out.
func checkImage(image string) string {
	if image == "" {
		return "an image is required (e.g. base/14.2-web)"
	}
	rest, ok := strings.CutPrefix(image, "base/")
	if !ok || rest == "" || len(image) > 200 {
		return fmt.Sprintf("%q is not a valid image (want base/<name>, e.g. base/14.2-web)", image)
	}
	for seg := range strings.SplitSeq(rest, "/") {
		if seg == "." || seg == ".." || !imageSegment.MatchString(seg) {
			return fmt.Sprintf("%q is not a valid image (each part after base/ is lowercase letters, digits, '-', '_' and '.')", image)
		}
	}
	return ""
}

// checkMountPath validates a path inside the jail: absolute, not the root,
// and never climbing with "..".
func checkMountPath(p string) string {
	switch {
	case p == "":
		return "a mount path is required"
	case !strings.HasPrefix(p, "/"):
		return fmt.Sprintf("%q is not an absolute path", p)
	case strings.Trim(p, "/") == "":
		return "cannot mount a volume on the jail's root"
	case strings.ContainsRune(p, 0):
		return "contains a NUL byte"
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return fmt.Sprintf("%q contains \"..\"", p)
		}
	}
	return ""
}

// checkEmail validates an ACME contact address: local@domain, with a fully
// qualified domain and nothing that would need quoting.
func checkEmail(email string) string {
	local, domain, ok := strings.Cut(email, "@")
	if !ok || !emailLocal.MatchString(local) || checkHostname(strings.ToLower(domain), true) != "" {
		return fmt.Sprintf("%q is not an email address (want e.g. ops@example.com)", email)
	}
	return ""
}

// CheckName returns an error when name is not a valid object name (a DNS
// label of at most 63 characters), for names that arrive from elsewhere
// than a spec file: command lines, the local API, reports.
func CheckName(name string) error {
	if msg := checkName(name); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// CheckHost returns an error when host is not a fully qualified DNS name
// as an Ingress's spec.host must be (lowercase labels, at most 253
// characters), for hosts that arrive from elsewhere than a spec file: the
// shared certificates' refs and metadata.
func CheckHost(host string) error {
	if msg := checkHostname(host, true); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// CheckImage returns an error when image is not a valid image name
// (base/<name>, never climbing out of base/), for drivers that turn it into
// a dataset or a path.
func CheckImage(image string) error {
	if msg := checkImage(image); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// CheckMountPath returns an error when p is not a valid mount path inside a
// jail (absolute, not the root, no ".." segment, no NUL byte).
func CheckMountPath(p string) error {
	if msg := checkMountPath(p); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// CheckBridge returns an error when name is not a Keel bridge name
// (keel<N>): "the bridge exists" counts as success, so any other name could
// attach jails to a host interface (docs/freebsd-notes.md §0).
func CheckBridge(name string) error {
	if !bridgeName.MatchString(name) {
		return fmt.Errorf("%q is not a Keel bridge name (want keel<N>, e.g. keel0)", name)
	}
	return nil
}

// CheckPool returns an error when name is not a ZFS pool name.
func CheckPool(name string) error {
	if !poolName.MatchString(name) || len(name) > 200 {
		return fmt.Errorf("%q is not a ZFS pool name", name)
	}
	return nil
}
