package dns01

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/ovh/go-ovh/ovh"
	"gopkg.in/yaml.v3"
)

// MaxConfigSize bounds the configuration file: a provider's settings fit in
// a few hundred bytes, so anything past this is a wrong path.
const MaxConfigSize = 64 << 10

// Defaults of the settings every provider shares (docs/ingress.md).
const (
	DefaultTTL                 = 120
	DefaultPropagationTimeout  = 5 * time.Minute
	DefaultPropagationInterval = 5 * time.Second
	DefaultExecTimeout         = 2 * time.Minute
	defaultResolvConf          = "/etc/resolv.conf"
)

// Provider names, as the configuration's provider field spells them.
const (
	ProviderOVH        = "ovh"
	ProviderCloudflare = "cloudflare"
	ProviderRFC2136    = "rfc2136"
	ProviderExec       = "exec"
)

var providerNames = []string{ProviderOVH, ProviderCloudflare, ProviderRFC2136, ProviderExec}

// ConfigError is one problem of a configuration file, at a position when
// it has one (Line 0 means the file as a whole). Its text never holds a
// credential: values of secret fields are not quoted.
type ConfigError struct {
	File   string
	Line   int
	Column int
	Field  string
	Msg    string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// config is a parsed configuration file. Fields of other providers than
// Provider are left zero (the parser refuses them).
type config struct {
	file     string
	Provider string

	TTL                 int
	PropagationTimeout  time.Duration
	PropagationInterval time.Duration
	Resolvers           []string // host:port, in order
	NameserverPort      int

	// ovh and cloudflare
	Endpoint string
	// ovh
	ApplicationKey    string
	ApplicationSecret string
	ConsumerKey       string
	// cloudflare
	APIToken string
	// rfc2136
	Server        string // host:port
	Zone          string // FQDN, or "" to find it
	TSIGKey       string // FQDN
	TSIGAlgorithm string // miekg/dns name, e.g. hmac-sha256.
	TSIGSecret    string // base64
	// exec
	Command     []string
	Timeout     time.Duration
	Env         [][2]string // in file order
	ErrorOutput bool

	pos map[string]*ConfigError // position of each field's value, Msg empty
}

// secrets returns the credential values of c, for redaction.
func (c *config) secrets() []string {
	var s []string
	for _, v := range []string{c.ApplicationKey, c.ApplicationSecret, c.ConsumerKey, c.APIToken, c.TSIGSecret} {
		if v != "" {
			s = append(s, v)
		}
	}
	for _, kv := range c.Env {
		if kv[1] != "" && credentialName.MatchString(kv[0]) {
			s = append(s, kv[1])
		}
	}
	return s
}

// credentialName matches the exec hook's environment variables whose
// values are blanked out of the hook's output in errors (errorOutput):
// the others are settings (a zone, a server) that an error may show.
var credentialName = regexp.MustCompile(`(?i)secret|token|key|pass|cred|auth`)

// field describes one key of the file: which providers take it (none
// listed: all of them) and how its value is decoded (a message when it is
// not valid). The decoders quote a value in their message only for
// fields that are not credentials.
type field struct {
	providers []string
	decode    func(c *config, v *yaml.Node) string
}

var fields = map[string]field{
	"provider":            {decode: str(func(c *config) *string { return &c.Provider })},
	"ttl":                 {decode: integer(func(c *config) *int { return &c.TTL }, 1, 86400)},
	"propagationTimeout":  {decode: duration(func(c *config) *time.Duration { return &c.PropagationTimeout })},
	"propagationInterval": {decode: duration(func(c *config) *time.Duration { return &c.PropagationInterval })},
	"resolvers":           {decode: decodeResolvers},
	"nameserverPort":      {decode: integer(func(c *config) *int { return &c.NameserverPort }, 1, 65535)},

	"endpoint":          {providers: []string{ProviderOVH, ProviderCloudflare}, decode: str(func(c *config) *string { return &c.Endpoint })},
	"applicationKey":    {providers: []string{ProviderOVH}, decode: str(func(c *config) *string { return &c.ApplicationKey })},
	"applicationSecret": {providers: []string{ProviderOVH}, decode: str(func(c *config) *string { return &c.ApplicationSecret })},
	"consumerKey":       {providers: []string{ProviderOVH}, decode: str(func(c *config) *string { return &c.ConsumerKey })},

	"apiToken": {providers: []string{ProviderCloudflare}, decode: str(func(c *config) *string { return &c.APIToken })},

	"server":        {providers: []string{ProviderRFC2136}, decode: str(func(c *config) *string { return &c.Server })},
	"zone":          {providers: []string{ProviderRFC2136}, decode: str(func(c *config) *string { return &c.Zone })},
	"tsigKey":       {providers: []string{ProviderRFC2136}, decode: str(func(c *config) *string { return &c.TSIGKey })},
	"tsigAlgorithm": {providers: []string{ProviderRFC2136}, decode: str(func(c *config) *string { return &c.TSIGAlgorithm })},
	"tsigSecret":    {providers: []string{ProviderRFC2136}, decode: str(func(c *config) *string { return &c.TSIGSecret })},

	"command":     {providers: []string{ProviderExec}, decode: decodeCommand},
	"timeout":     {providers: []string{ProviderExec}, decode: duration(func(c *config) *time.Duration { return &c.Timeout })},
	"env":         {providers: []string{ProviderExec}, decode: decodeEnv},
	"errorOutput": {providers: []string{ProviderExec}, decode: boolean(func(c *config) *bool { return &c.ErrorOutput })},
}

// readConfig reads path with the checks a credentials file deserves: a
// regular file (a FIFO or a device would block or never end), not readable
// or writable by group or others, at most MaxConfigSize bytes.
func readConfig(path string) ([]byte, error) {
	fileErr := func(format string, args ...any) error {
		return &ConfigError{File: path, Msg: fmt.Sprintf(format, args...)}
	}
	// O_NONBLOCK: opening a FIFO (swapped in after any earlier check)
	// must not hang; the checks below are on what was opened.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("dns01: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("dns01: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fileErr("not a regular file (%s)", fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fileErr("mode %04o lets other users read or change the DNS credentials; chmod 600 it", perm)
	}
	if fi.Size() > MaxConfigSize {
		return nil, fileErr("%d bytes, more than the %d a DNS provider configuration may have", fi.Size(), MaxConfigSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("dns01: %w", err)
	}
	if len(data) > MaxConfigSize {
		return nil, fileErr("more than the %d bytes a DNS provider configuration may have", MaxConfigSize)
	}
	return data, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseConfig decodes a configuration file strictly: one YAML mapping,
// no unknown, duplicate or misplaced field, no alias, every value of its
// type; then checks what each provider needs and fills in the defaults.
// All problems are returned at once, joined, in file order.
func parseConfig(file string, data []byte) (*config, error) {
	c := &config{file: file, pos: map[string]*ConfigError{}}
	var errs []*ConfigError
	errorAt := func(n *yaml.Node, name, format string, args ...any) {
		e := &ConfigError{File: file, Field: name, Msg: fmt.Sprintf(format, args...)}
		if n != nil {
			e.Line, e.Column = n.Line, n.Column
		}
		errs = append(errs, e)
	}

	var doc yaml.Node
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &ConfigError{File: file, Msg: "empty: want at least provider: " + strings.Join(providerNames, ", ")}
		}
		// yaml.v3's syntax errors name a line and say what was expected,
		// not the text found, so they hold no credential.
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, &ConfigError{File: file, Line: line, Column: 1, Msg: m[2]}
		}
		return nil, &ConfigError{File: file, Msg: "not valid YAML"}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &ConfigError{File: file, Msg: "more than one YAML document"}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, &ConfigError{File: file, Line: root.Line, Column: root.Column, Msg: "want a mapping of settings (provider: ..., ...)"}
	}

	// The provider comes first: it decides which other fields are allowed.
	var providerVal *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if k := root.Content[i]; k.Kind == yaml.ScalarNode && k.Value == "provider" {
			providerVal = root.Content[i+1]
			break
		}
	}
	provider := ""
	if providerVal != nil && providerVal.Kind == yaml.ScalarNode {
		provider = providerVal.Value
	}
	known := slices.Contains(providerNames, provider)

	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
			errorAt(k, "", "want a field name")
			continue
		}
		name := k.Value
		f, ok := fields[name]
		switch {
		case !ok:
			errorAt(k, name, "unknown field")
			continue
		case seen[name]:
			errorAt(k, name, "written twice")
			continue
		case known && len(f.providers) > 0 && !slices.Contains(f.providers, provider):
			errorAt(k, name, "not a setting of provider %s (it is one of %s)", provider, strings.Join(f.providers, ", "))
			continue
		}
		seen[name] = true
		c.pos[name] = &ConfigError{File: file, Line: v.Line, Column: v.Column, Field: name}
		if v.Kind == yaml.AliasNode || v.Alias != nil {
			errorAt(v, name, "aliases are not allowed")
			continue
		}
		if msg := f.decode(c, v); msg != "" {
			errorAt(v, name, "%s", msg)
		}
	}

	c.check(provider, providerVal, errorAt)
	if len(errs) > 0 {
		slices.SortStableFunc(errs, func(a, b *ConfigError) int {
			return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
		})
		joined := make([]error, len(errs))
		for i, e := range errs {
			joined[i] = e
		}
		return nil, errors.Join(joined...)
	}
	return c, nil
}

// check verifies what the provider needs and fills in the defaults.
func (c *config) check(provider string, providerVal *yaml.Node, errorAt func(n *yaml.Node, name, format string, args ...any)) {
	// missing reports a required field that was not written, at the
	// provider field (the reader adds the field next to it).
	missing := func(name, what string) {
		errorAt(providerVal, name, "missing: provider %s needs %s", provider, what)
	}
	at := func(name string) *yaml.Node {
		if p := c.pos[name]; p != nil {
			return &yaml.Node{Line: p.Line, Column: p.Column}
		}
		return providerVal
	}
	switch {
	case providerVal == nil:
		errorAt(&yaml.Node{Line: 1, Column: 1}, "provider", "missing: want one of %s", strings.Join(providerNames, ", "))
		return
	case !slices.Contains(providerNames, provider):
		errorAt(providerVal, "provider", "unknown provider %q: want one of %s", clip(provider), strings.Join(providerNames, ", "))
		return
	}

	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.PropagationTimeout == 0 {
		c.PropagationTimeout = DefaultPropagationTimeout
	}
	if c.PropagationInterval == 0 {
		c.PropagationInterval = min(DefaultPropagationInterval, c.PropagationTimeout)
	}
	if c.PropagationInterval > c.PropagationTimeout {
		errorAt(at("propagationInterval"), "propagationInterval", "%s is longer than propagationTimeout (%s)", c.PropagationInterval, c.PropagationTimeout)
	}
	if c.NameserverPort == 0 {
		c.NameserverPort = 53
	}

	switch provider {
	case ProviderOVH:
		for _, f := range []string{"applicationKey", "applicationSecret", "consumerKey"} {
			if c.pos[f] == nil {
				missing(f, "an application key, its secret and a consumer key (docs/ingress.md)")
			}
		}
		switch {
		case c.Endpoint == "":
			c.Endpoint = ovh.OvhEU
		case strings.Contains(c.Endpoint, "/"):
			if msg := checkURL(c.Endpoint); msg != "" {
				errorAt(at("endpoint"), "endpoint", "%s", msg)
			}
			c.Endpoint = strings.TrimRight(c.Endpoint, "/")
		case ovh.Endpoints[c.Endpoint] == "":
			errorAt(at("endpoint"), "endpoint", "unknown OVH endpoint %q: want ovh-eu, ovh-ca, ovh-us, ... or an https:// URL", clip(c.Endpoint))
		default:
			c.Endpoint = ovh.Endpoints[c.Endpoint]
		}
	case ProviderCloudflare:
		if c.pos["apiToken"] == nil {
			missing("apiToken", "an API token with Zone:Read and DNS:Edit on the zone (docs/ingress.md)")
		}
		if c.Endpoint != "" {
			if msg := checkURL(c.Endpoint); msg != "" {
				errorAt(at("endpoint"), "endpoint", "%s", msg)
			}
		}
		if c.TTL < 120 {
			errorAt(at("ttl"), "ttl", "%d: Cloudflare takes at least 120", c.TTL)
		}
	case ProviderRFC2136:
		if c.pos["server"] == nil {
			missing("server", "the server that takes the updates (host or host:port)")
		} else if hp, msg := hostPort(c.Server); msg != "" {
			errorAt(at("server"), "server", "%s", msg)
		} else {
			c.Server = hp
		}
		if c.Zone != "" {
			if _, ok := dns.IsDomainName(c.Zone); !ok {
				errorAt(at("zone"), "zone", "%q is not a domain name", clip(c.Zone))
			}
			c.Zone = dns.CanonicalName(c.Zone)
		}
		if c.pos["tsigKey"] == nil {
			missing("tsigKey", "a TSIG key name and secret (unsigned updates are not supported)")
		} else if _, ok := dns.IsDomainName(c.TSIGKey); !ok {
			errorAt(at("tsigKey"), "tsigKey", "%q is not a key name", clip(c.TSIGKey))
		}
		c.TSIGKey = dns.CanonicalName(c.TSIGKey)
		if c.pos["tsigSecret"] == nil {
			missing("tsigSecret", "the TSIG key's secret (base64)")
		} else if _, err := base64.StdEncoding.DecodeString(c.TSIGSecret); err != nil || c.TSIGSecret == "" {
			errorAt(at("tsigSecret"), "tsigSecret", "not valid base64 (as tsig-keygen or knotc print it)")
		}
		alg := strings.ToLower(strings.TrimSuffix(c.TSIGAlgorithm, "."))
		switch alg {
		case "":
			c.TSIGAlgorithm = dns.HmacSHA256
		case "hmac-sha1", "hmac-sha224", "hmac-sha256", "hmac-sha384", "hmac-sha512":
			c.TSIGAlgorithm = alg + "."
		default:
			errorAt(at("tsigAlgorithm"), "tsigAlgorithm", "%q: want hmac-sha256 (the default), hmac-sha512, hmac-sha384, hmac-sha224 or hmac-sha1", clip(c.TSIGAlgorithm))
		}
	case ProviderExec:
		if c.pos["command"] == nil {
			missing("command", "the program to run and its first arguments, e.g. [/usr/local/libexec/dns-hook]")
		}
		if c.Timeout == 0 {
			c.Timeout = DefaultExecTimeout
		}
	}
}

// hostPort returns s as host:port, with port 53 when s has none.
func hostPort(s string) (string, string) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		host, port = strings.Trim(s, "[]"), "53"
	}
	if host == "" || strings.ContainsAny(host, " /\t") {
		return "", fmt.Sprintf("%q: want host or host:port", clip(s))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Sprintf("%q: port %q is not a port number", clip(s), clip(port))
	}
	return net.JoinHostPort(host, port), ""
}

func checkURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Sprintf("%q: want an http(s):// URL without credentials, query or fragment", clip(s))
	}
	return ""
}

// clip bounds a value quoted in an error (a non-secret field may still be
// long).
func clip(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

func scalar(v *yaml.Node) (string, string) {
	if v.Kind != yaml.ScalarNode {
		return "", "want a single value"
	}
	if v.Tag == "!!null" || v.Value == "" {
		return "", "empty value"
	}
	return v.Value, ""
}

func str(dst func(*config) *string) func(*config, *yaml.Node) string {
	return func(c *config, v *yaml.Node) string {
		s, msg := scalar(v)
		if msg == "" {
			if strings.ContainsAny(s, "\x00\r\n") {
				return "a line break or NUL in the value"
			}
			*dst(c) = s
		}
		return msg
	}
}

func integer(dst func(*config) *int, lo, hi int) func(*config, *yaml.Node) string {
	return func(c *config, v *yaml.Node) string {
		s, msg := scalar(v)
		if msg != "" {
			return msg
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			return fmt.Sprintf("%q: want a whole number from %d to %d", clip(s), lo, hi)
		}
		*dst(c) = n
		return ""
	}
}

func duration(dst func(*config) *time.Duration) func(*config, *yaml.Node) string {
	return func(c *config, v *yaml.Node) string {
		s, msg := scalar(v)
		if msg != "" {
			return msg
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > 24*time.Hour {
			return fmt.Sprintf("%q: want a duration such as 90s or 5m, at most 24h", clip(s))
		}
		*dst(c) = d
		return ""
	}
}

func boolean(dst func(*config) *bool) func(*config, *yaml.Node) string {
	return func(c *config, v *yaml.Node) string {
		s, msg := scalar(v)
		if msg != "" {
			return msg
		}
		b, err := strconv.ParseBool(s)
		if err != nil || v.Tag != "!!bool" {
			return fmt.Sprintf("%q: want true or false", clip(s))
		}
		*dst(c) = b
		return ""
	}
}

// list decodes a sequence of at most max scalars.
func list(v *yaml.Node, max int) ([]string, string) {
	if v.Kind != yaml.SequenceNode {
		return nil, "want a list, e.g. [a, b]"
	}
	if len(v.Content) == 0 {
		return nil, "empty list"
	}
	if len(v.Content) > max {
		return nil, fmt.Sprintf("%d entries, at most %d", len(v.Content), max)
	}
	out := make([]string, 0, len(v.Content))
	for i, e := range v.Content {
		s, msg := scalar(e)
		if msg != "" {
			return nil, fmt.Sprintf("entry %d: %s", i+1, msg)
		}
		out = append(out, s)
	}
	return out, ""
}

func decodeResolvers(c *config, v *yaml.Node) string {
	l, msg := list(v, 8)
	if msg != "" {
		return msg
	}
	for _, s := range l {
		hp, msg := hostPort(s)
		if msg != "" {
			return msg
		}
		host, _, _ := net.SplitHostPort(hp)
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Sprintf("%q: want an IP address, with a port or not", clip(s))
		}
		c.Resolvers = append(c.Resolvers, hp)
	}
	return ""
}

func decodeCommand(c *config, v *yaml.Node) string {
	l, msg := list(v, 64)
	if msg != "" {
		return msg
	}
	if !strings.HasPrefix(l[0], "/") {
		return fmt.Sprintf("%q: the program must be an absolute path (no shell and no PATH lookup)", clip(l[0]))
	}
	for _, a := range l {
		if strings.ContainsRune(a, 0) {
			return "a NUL in an argument"
		}
	}
	c.Command = l
	return ""
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func decodeEnv(c *config, v *yaml.Node) string {
	if v.Kind != yaml.MappingNode {
		return "want a mapping of variable names to values"
	}
	if len(v.Content) > 2*64 {
		return "more than 64 variables"
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if k.Kind != yaml.ScalarNode || !envName.MatchString(k.Value) {
			return fmt.Sprintf("line %d: want a variable name ([A-Za-z_][A-Za-z0-9_]*)", k.Line)
		}
		if seen[k.Value] {
			return fmt.Sprintf("line %d: %s written twice", k.Line, k.Value)
		}
		seen[k.Value] = true
		// Values are the hook's credentials: never quoted.
		if val.Kind != yaml.ScalarNode || val.Alias != nil {
			return fmt.Sprintf("line %d: %s: want a single value", val.Line, k.Value)
		}
		if strings.ContainsRune(val.Value, 0) {
			return fmt.Sprintf("line %d: %s: a NUL in the value", val.Line, k.Value)
		}
		c.Env = append(c.Env, [2]string{k.Value, val.Value})
	}
	return ""
}
