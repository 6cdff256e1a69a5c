package render

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// CPU is an amount of processor time in thousandths of a core. It is written
// as cores ("2", "0.5", 1.5) or millicores ("500m"); the smallest amount is
// 10m (1 % of a core, the granularity of rctl's pcpu) and the largest 1024.
type CPU int64

const (
	minCPU CPU = 10
	maxCPU CPU = 1024 * 1000
)

func (c *CPU) parseScalar(text string) error {
	bad := fmt.Errorf("%q is not a CPU amount (want cores such as 2 or 0.5, or millicores such as 500m)", text)
	s := strings.TrimSpace(text)
	var r *big.Rat
	if m, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseInt(m, 10, 64)
		if err != nil || n < 0 || strings.HasPrefix(m, "+") {
			return bad
		}
		r = new(big.Rat).SetInt64(n)
	} else {
		v, ok := new(big.Rat).SetString(s)
		if !ok || strings.ContainsAny(s, "/eE+") {
			return bad
		}
		r = v.Mul(v, big.NewRat(1000, 1))
	}
	if !r.IsInt() {
		return fmt.Errorf("%q is finer than a millicore", text)
	}
	if r.Sign() <= 0 || r.Cmp(big.NewRat(int64(minCPU), 1)) < 0 {
		return fmt.Errorf("%q is less than the smallest CPU amount, 10m (1%% of a core)", text)
	}
	if r.Cmp(big.NewRat(int64(maxCPU), 1)) > 0 {
		return fmt.Errorf("%q is more than 1024 cores", text)
	}
	*c = CPU(r.Num().Int64())
	return nil
}

// String writes whole cores as a plain number and anything else in
// millicores, e.g. "2" or "1500m".
func (c CPU) String() string {
	if c%1000 == 0 {
		return strconv.FormatInt(int64(c/1000), 10)
	}
	return strconv.FormatInt(int64(c), 10) + "m"
}

// MarshalText implements encoding.TextMarshaler.
func (c CPU) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (c *CPU) UnmarshalText(b []byte) error { return c.parseScalar(string(b)) }

// Bytes is a size in bytes, written as a whole number with an optional binary
// suffix: K, M, G or T (powers of 1024; "Mi"-style suffixes are accepted too).
type Bytes int64

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}}

func (b *Bytes) parseScalar(text string) error {
	bad := fmt.Errorf("%q is not a size (want e.g. 512M, 2G)", text)
	s := strings.ToUpper(strings.TrimSpace(text))
	shift := uint(0)
	for _, u := range byteUnits {
		// 512M, and the spellings 512MI, 512MB and 512MIB of the same size.
		for _, suffix := range []string{u.suffix + "IB", u.suffix + "I", u.suffix + "B", u.suffix} {
			if n, ok := strings.CutSuffix(s, suffix); ok {
				s, shift = n, u.shift
				break
			}
		}
		if shift != 0 {
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || s == "" || s[0] == '+' {
		return bad
	}
	if n == 0 {
		return fmt.Errorf("%q: a size must be more than zero", text)
	}
	if n > (1<<62)>>shift {
		return fmt.Errorf("%q is too large", text)
	}
	*b = Bytes(n << shift)
	return nil
}

// String writes the size with the largest suffix that divides it exactly.
func (b Bytes) String() string {
	for _, u := range byteUnits {
		if b != 0 && b%(1<<u.shift) == 0 {
			return strconv.FormatInt(int64(b>>u.shift), 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// MarshalText implements encoding.TextMarshaler.
func (b Bytes) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *Bytes) UnmarshalText(t []byte) error { return b.parseScalar(string(t)) }

// Duration is a positive time.Duration written in Go's syntax ("30s", "1m30s").
type Duration time.Duration

func (d *Duration) parseScalar(text string) error {
	v, err := time.ParseDuration(strings.TrimSpace(text))
	if err != nil {
		return fmt.Errorf("%q is not a duration (want e.g. 30s, 1m)", text)
	}
	if v <= 0 {
		return fmt.Errorf("%q: a duration must be more than zero", text)
	}
	*d = Duration(v)
	return nil
}

// String writes the duration the way time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(t []byte) error { return d.parseScalar(string(t)) }

// Addr is an IPv4 address written bare ("10.200.11.5").
type Addr struct{ netip.Addr }

func (a *Addr) parseScalar(text string) error {
	s := strings.TrimSpace(text)
	if strings.Contains(s, "/") {
		return fmt.Errorf("%q: want a bare address such as 10.200.11.5, without a prefix length", text)
	}
	v, err := netip.ParseAddr(s)
	if err != nil {
		return fmt.Errorf("%q is not an IP address", text)
	}
	if !v.Is4() {
		return fmt.Errorf("%q: only IPv4 addresses are supported", text)
	}
	a.Addr = v
	return nil
}

// hostAddr is a Jail's network.address as written: a bare IPv4 address
// ("10.200.11.5"), or the address with its subnet's prefix length
// ("10.200.11.5/24", the form ifconfig and jail.conf use). Only the address
// reaches the model; the prefix, when written, is checked against the
// subnet of the node the address picks (see placeAddress).
type hostAddr struct {
	Addr netip.Addr
	// Prefix is the subnet written with the address (host bits kept);
	// invalid when the address was written bare.
	Prefix netip.Prefix
}

func (h *hostAddr) parseScalar(text string) error {
	s := strings.TrimSpace(text)
	if !strings.Contains(s, "/") {
		var a Addr
		if err := a.parseScalar(s); err != nil {
			return err
		}
		h.Addr = a.Addr
		return nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return fmt.Errorf("%q is not an address (want a bare address such as 10.200.11.5, or one with its node's prefix length such as 10.200.11.5/24)", text)
	}
	if !p.Addr().Is4() {
		return fmt.Errorf("%q: only IPv4 addresses are supported", text)
	}
	// A /31 or /32 has no network or broadcast address; such a prefix is
	// refused later, as not the node's subnet.
	if net := p.Masked(); p.Bits() <= 30 {
		switch addrOffset(net, p.Addr()) {
		case 0:
			return fmt.Errorf("%q is the network address of %s, not a host address", text, net)
		case 1<<(32-p.Bits()) - 1:
			return fmt.Errorf("%q is the broadcast address of %s, not a host address", text, net)
		}
	}
	h.Addr, h.Prefix = p.Addr(), p
	return nil
}

// IsValid reports whether an address was written.
func (h hostAddr) IsValid() bool { return h.Addr.IsValid() }

// Prefix is an IPv4 network in CIDR notation ("10.200.0.0/16"), with no host
// bits set.
type Prefix struct{ netip.Prefix }

func (p *Prefix) parseScalar(text string) error {
	v, err := netip.ParsePrefix(strings.TrimSpace(text))
	if err != nil {
		return fmt.Errorf("%q is not a CIDR (want e.g. 10.200.0.0/16)", text)
	}
	if !v.Addr().Is4() {
		return fmt.Errorf("%q: only IPv4 networks are supported", text)
	}
	if v.Masked() != v {
		return fmt.Errorf("%q has host bits set (did you mean %s?)", text, v.Masked())
	}
	p.Prefix = v
	return nil
}

// MarshalText writes the zero Prefix as an empty string.
func (p Prefix) MarshalText() ([]byte, error) {
	if !p.IsValid() {
		return []byte{}, nil
	}
	return p.Prefix.MarshalText()
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Prefix) UnmarshalText(t []byte) error {
	if len(t) == 0 {
		*p = Prefix{}
		return nil
	}
	return p.parseScalar(string(t))
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Addr) UnmarshalText(t []byte) error {
	if len(t) == 0 {
		*a = Addr{}
		return nil
	}
	return a.parseScalar(string(t))
}

// IsZero reports whether the address is unset (for omitempty and omitzero).
func (a Addr) IsZero() bool { return !a.IsValid() }

// IsZero reports whether the prefix is unset (for omitempty and omitzero).
func (p Prefix) IsZero() bool { return !p.IsValid() }

// maxFileMode is the largest mode an artifact may have: permission bits
// only, no setuid, setgid or sticky bit.
const maxFileMode FileMode = 0o777

// parseScalar reads a mode as written, in octal with a leading 0 (0755,
// 0o755, or either quoted): the scalar's text is read, not the number YAML
// would make of it, which depends on the YAML version. Digits without the
// leading 0 (755) are refused rather than guessed at: a tool that
// rewrites YAML 1.1 turns 0644 into 420, which read as octal would be
// another mode.
func (m *FileMode) parseScalar(text string) error {
	s := strings.TrimSpace(text)
	want := "want 0 to 0777 in octal, e.g. 0644 or 0755"
	digits, ok := strings.CutPrefix(s, "0o")
	if !ok {
		digits, ok = strings.CutPrefix(s, "0O")
	}
	if !ok && strings.HasPrefix(s, "0") {
		digits, ok = s, true
	}
	v, err := strconv.ParseUint(digits, 8, 32)
	switch {
	case digits == "" || err != nil && !errors.Is(err, strconv.ErrRange):
		return fmt.Errorf("%q is not a file mode (%s)", text, want)
	case !ok:
		return fmt.Errorf("%q has no leading 0: write the mode in octal, as in 0%s (without the 0, YAML reads it as a decimal number)", text, s)
	case err != nil || v > 0o7777:
		return fmt.Errorf("%q is not a file mode (%s)", text, want)
	case FileMode(v) > maxFileMode:
		return fmt.Errorf("%q sets the setuid, setgid or sticky bit, which an artifact may not have (%s)", text, want)
	}
	*m = FileMode(v)
	return nil
}

// MarshalText writes the mode in octal ("0755"), as it is written in a
// spec.
func (m FileMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *FileMode) UnmarshalText(t []byte) error { return m.parseScalar(string(t)) }
