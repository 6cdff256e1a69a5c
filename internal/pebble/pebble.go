//go:build unix

// Package pebble runs Let's Encrypt's test CA, Pebble, and its DNS test
// server, pebble-challtestsrv, as child processes on a loopback address,
// for tests, the end-to-end suite and `keel demo`. Both are pinned in
// go.mod as tool dependencies, so the module proxy and go.sum fix their
// code and neither enters keel's binary: Build compiles them with the go
// command. What Pebble issues is trusted by nothing but whoever fetches
// its roots from this package; it must never stand in for a real CA.
package pebble

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"time"
)

// Version is the Pebble release go.mod pins (its tool directives).
const Version = "v2.10.3"

const (
	pebblePkg = "github.com/letsencrypt/pebble/v2/cmd/pebble"
	challPkg  = "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv"
)

// DefaultDir is where Build keeps the binaries between runs: a directory
// named after Version under the user's cache directory (the system's
// temporary directory when there is none).
func DefaultDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "keel-pebble-"+Version)
}

// Build returns the paths of the pebble and pebble-challtestsrv binaries in
// dir, compiling them there first if they are not there yet. The binaries
// are named after Version, so a dir outlives an upgrade of the pin. It
// runs `go build` in the current directory, which must be inside Keel's
// module (tests, the end-to-end suite and `make demo` are); elsewhere it
// falls back to `go install <pkg>@Version`. Concurrent Builds into one dir
// are safe: each binary is written to a temporary name and renamed.
func Build(dir string) (pebbleBin, challBin string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("pebble: %w", err)
	}
	if pebbleBin, err = buildTool(dir, pebblePkg); err != nil {
		return "", "", err
	}
	if challBin, err = buildTool(dir, challPkg); err != nil {
		return "", "", err
	}
	return pebbleBin, challBin, nil
}

func buildTool(dir, pkg string) (string, error) {
	name := filepath.Base(pkg)
	bin := filepath.Join(dir, name+"-"+Version)
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin, nil
	}
	tmp, err := os.MkdirTemp(dir, ".build-*")
	if err != nil {
		return "", fmt.Errorf("pebble: %w", err)
	}
	defer os.RemoveAll(tmp)
	out, err := exec.Command("go", "build", "-o", filepath.Join(tmp, name), pkg).CombinedOutput()
	if err != nil {
		// Outside Keel's module: install the pinned release by version.
		cmd := exec.Command("go", "install", pkg+"@"+Version)
		cmd.Env = append(os.Environ(), "GOBIN="+tmp)
		out2, err2 := cmd.CombinedOutput()
		if err2 != nil {
			return "", fmt.Errorf("pebble: building %s: %w\n%s\n%s", name, err2, bytes.TrimSpace(out), bytes.TrimSpace(out2))
		}
	}
	if err := os.Rename(filepath.Join(tmp, name), bin); err != nil {
		return "", fmt.Errorf("pebble: %w", err)
	}
	return bin, nil
}

// Options configures a Pebble and its challenge test server. The zero
// value of every knob is the one tests want: fast, deterministic
// validation.
type Options struct {
	// Dir holds Pebble's configuration, its web front end's certificate
	// and both processes' logs (pebble.log, challtestsrv.log). Required.
	Dir string
	// PebbleBin and ChallBin are the binaries Build returned. Required.
	PebbleBin, ChallBin string

	// IP is the loopback address every listener binds; 127.0.0.1 if empty.
	IP string
	// HTTPPort is the port Pebble's validation authority connects to for
	// HTTP-01 (the ingress's HTTP port). Zero picks a free one, reported
	// in Server.HTTPPort, for the caller to listen on.
	HTTPPort int
	// TLSPort is the port of TLS-ALPN-01 validation (Keel does not use
	// it). Zero picks a free one.
	TLSPort int
	// DefaultIPv4 is the address challtestsrv answers every A query with
	// (unless AddA says otherwise): where Pebble connects for HTTP-01.
	// IP if empty. No AAAA answers are given, so validation never tries
	// an IPv6 address nothing listens on.
	DefaultIPv4 string

	// Validity is the lifetime of the certificates Pebble issues, in
	// whole seconds (its default profile's validityPeriod); zero keeps
	// Pebble's default of 90 days.
	Validity time.Duration

	// VASleep lets the validation authority sleep up to 5 s before each
	// validation, as Pebble does by default (PEBBLE_VA_NOSLEEP unset);
	// off, it validates at once.
	VASleep bool
	// AlwaysValid makes every challenge valid without checking it
	// (PEBBLE_VA_ALWAYS_VALID=1).
	AlwaysValid bool
	// NonceReject is the percentage of good nonces Pebble rejects as bad
	// (PEBBLE_WFE_NONCEREJECT); zero rejects none (Pebble's own default
	// is 5).
	NonceReject int
	// AuthzReuse is the percentage of new orders that reuse a valid
	// authorization (PEBBLE_AUTHZREUSE); zero never does (Pebble's
	// default is 50), so every order is validated.
	AuthzReuse int
	// Env holds more variables for Pebble, NAME=value, applied last.
	Env []string

	// StartTimeout bounds Start's wait for both processes to answer;
	// 30 s if zero.
	StartTimeout time.Duration
}

// Server is a running Pebble with its challenge test server. Close stops
// both. Its methods are safe for concurrent use.
type Server struct {
	// DirectoryURL is the ACME directory, over HTTPS.
	DirectoryURL string
	// DirectoryRoots (and DirectoryRootsPEM) verify the certificate of
	// Pebble's HTTPS endpoints: give them to the ACME client.
	DirectoryRoots    *x509.CertPool
	DirectoryRootsPEM []byte
	// IssuingRoots (and IssuingRootsPEM) are the roots of the
	// certificates Pebble issues: a TLS client that should trust them
	// trusts only these. Pebble makes new ones at every start.
	IssuingRoots    *x509.CertPool
	IssuingRootsPEM []byte
	// IntermediatesPEM are the intermediates Pebble issues under (it
	// sends them with every certificate).
	IntermediatesPEM []byte

	// HTTPPort is where Pebble connects for HTTP-01 validation.
	HTTPPort int
	// DNSAddr is challtestsrv's DNS server (UDP and TCP), which Pebble
	// resolves every name with.
	DNSAddr string
	// ManagementURL is Pebble's management API; ChallURL challtestsrv's.
	ManagementURL, ChallURL string
	// PebbleLog and ChallLog are the processes' output.
	PebbleLog, ChallLog string

	http      *http.Client // for challtestsrv's plain HTTP API
	procs     []*proc
	closeOnce stdsync.Once
}

// proc is a child process. Its Wait runs in a goroutine of its own, which
// closes exited; Close kills the process group and waits for it.
type proc struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// errEarlyExit and errAddrInUse mark a start that lost a port to another
// process between picking it and binding it: Start retries with others.
var (
	errEarlyExit = errors.New("exited before answering")
	errAddrInUse = errors.New("a port it was given is in use")
)

// Start starts challtestsrv and Pebble and waits until both answer. It
// retries with other ports when a port it picked was taken meanwhile.
func Start(opts Options) (*Server, error) {
	if opts.Dir == "" || opts.PebbleBin == "" || opts.ChallBin == "" {
		return nil, errors.New("pebble: Options.Dir, PebbleBin and ChallBin are required")
	}
	if opts.IP == "" {
		opts.IP = "127.0.0.1"
	}
	if opts.DefaultIPv4 == "" {
		opts.DefaultIPv4 = opts.IP
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	wfe, err := writeWFECert(opts.Dir, opts.IP)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(opts.IP, 6)
		if err != nil {
			return nil, err
		}
		s, err := start(opts, wfe, ports)
		if err == nil {
			return s, nil
		}
		if attempt == 5 || !(errors.Is(err, errEarlyExit) || errors.Is(err, errAddrInUse)) {
			return nil, err
		}
	}
}

// wfeCert is the web front end's certificate, made for this Pebble.
type wfeCert struct {
	rootPEM           []byte
	roots             *x509.CertPool
	certFile, keyFile string
}

// writeWFECert makes a CA and, under it, a certificate for ip and
// localhost, and writes the certificate and key where Pebble reads them.
func writeWFECert(dir, ip string) (*wfeCert, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "keel test Pebble web front end CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP(ip)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	w := &wfeCert{
		rootPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		roots:    x509.NewCertPool(),
		certFile: filepath.Join(dir, "wfe-cert.pem"),
		keyFile:  filepath.Join(dir, "wfe-key.pem"),
	}
	w.roots.AddCert(caCert)
	if err := os.WriteFile(w.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	if err := os.WriteFile(w.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "wfe-ca.pem"), w.rootPEM, 0o600); err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	return w, nil
}

// config is the part of Pebble's JSON configuration Keel sets.
type config struct {
	Pebble struct {
		ListenAddress           string             `json:"listenAddress"`
		ManagementListenAddress string             `json:"managementListenAddress"`
		Certificate             string             `json:"certificate"`
		PrivateKey              string             `json:"privateKey"`
		HTTPPort                int                `json:"httpPort"`
		TLSPort                 int                `json:"tlsPort"`
		KeyAlgorithm            string             `json:"keyAlgorithm"`
		Profiles                map[string]profile `json:"profiles"`
	} `json:"pebble"`
}

type profile struct {
	Description    string `json:"description"`
	ValidityPeriod uint64 `json:"validityPeriod"`
}

// start starts both processes on ports: challtestsrv's DNS and API,
// Pebble's directory and management API, and, unless opts sets them, the
// TLS-ALPN-01 and HTTP-01 ports.
func start(opts Options, wfe *wfeCert, ports []int) (_ *Server, err error) {
	dnsPort, chalMgmt, listen, mgmt, tlsPort, httpPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	if opts.TLSPort != 0 {
		tlsPort = opts.TLSPort
	}
	if opts.HTTPPort != 0 {
		httpPort = opts.HTTPPort
	}
	hostPort := func(port int) string { return net.JoinHostPort(opts.IP, strconv.Itoa(port)) }

	s := &Server{
		DirectoryURL:      "https://" + hostPort(listen) + "/dir",
		DirectoryRoots:    wfe.roots,
		DirectoryRootsPEM: wfe.rootPEM,
		HTTPPort:          httpPort,
		DNSAddr:           hostPort(dnsPort),
		ManagementURL:     "https://" + hostPort(mgmt),
		ChallURL:          "http://" + hostPort(chalMgmt),
		PebbleLog:         filepath.Join(opts.Dir, "pebble.log"),
		ChallLog:          filepath.Join(opts.Dir, "challtestsrv.log"),
		http:              &http.Client{Transport: &http.Transport{}},
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	deadline := time.Now().Add(opts.StartTimeout)

	// challtestsrv: DNS and its management API only.
	chall, err := startProc(s.ChallLog, nil, opts.ChallBin,
		"-dnsserver", s.DNSAddr,
		"-management", hostPort(chalMgmt),
		"-defaultIPv4", opts.DefaultIPv4,
		"-defaultIPv6", "",
		"-http01", "", "-https01", "", "-doh", "", "-tlsalpn01", "")
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, chall)
	if err := s.waitChall(chall, deadline); err != nil {
		return nil, err
	}

	// Pebble.
	var c config
	c.Pebble.ListenAddress = hostPort(listen)
	c.Pebble.ManagementListenAddress = hostPort(mgmt)
	c.Pebble.Certificate, c.Pebble.PrivateKey = wfe.certFile, wfe.keyFile
	c.Pebble.HTTPPort, c.Pebble.TLSPort = httpPort, tlsPort
	c.Pebble.KeyAlgorithm = "ecdsa"
	// One profile only: Pebble picks a random one for orders that name
	// none.
	c.Pebble.Profiles = map[string]profile{"default": {
		Description:    "keel tests",
		ValidityPeriod: uint64(opts.Validity / time.Second),
	}}
	js, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	cfgFile := filepath.Join(opts.Dir, "pebble-config.json")
	if err := os.WriteFile(cfgFile, js, 0o600); err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	env := []string{
		"PEBBLE_WFE_NONCEREJECT=" + strconv.Itoa(opts.NonceReject),
		"PEBBLE_AUTHZREUSE=" + strconv.Itoa(opts.AuthzReuse),
	}
	if !opts.VASleep {
		env = append(env, "PEBBLE_VA_NOSLEEP=1")
	}
	if opts.AlwaysValid {
		env = append(env, "PEBBLE_VA_ALWAYS_VALID=1")
	}
	env = append(env, opts.Env...)
	peb, err := startProc(s.PebbleLog, env, opts.PebbleBin, "-config", cfgFile, "-dnsserver", s.DNSAddr)
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, peb)
	if err := s.waitPebble(peb, deadline); err != nil {
		return nil, err
	}
	return s, nil
}

// freePorts returns n distinct ports free for TCP and UDP on ip when it
// looked. Another process may bind one before the caller does: Start
// notices and retries.
func freePorts(ip string, n int) ([]int, error) {
	var (
		ports []int
		held  []io.Closer
	)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == 100 {
			return nil, errors.New("pebble: found no free port")
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, fmt.Errorf("pebble: %w", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			continue // UDP taken: try another
		}
		held = append(held, u)
		ports = append(ports, port)
	}
	return ports, nil
}

func startProc(logFile string, env []string, bin string, args ...string) (*proc, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, fmt.Errorf("pebble: %w", err)
	}
	defer f.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Dir = filepath.Dir(logFile)
	cmd.Env = env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pebble: starting %s: %w", filepath.Base(bin), err)
	}
	p := &proc{cmd: cmd, log: logFile, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop kills the process's group and waits for it.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// check reports whether the process has died or says it could not bind.
func (p *proc) check() error {
	select {
	case <-p.exited:
		return fmt.Errorf("pebble: %s %w (%v):\n%s", filepath.Base(p.cmd.Path), errEarlyExit, p.err, tail(p.log, 20))
	default:
	}
	if b, _ := os.ReadFile(p.log); bytes.Contains(b, []byte("address already in use")) {
		return fmt.Errorf("pebble: %s: %w:\n%s", filepath.Base(p.cmd.Path), errAddrInUse, tail(p.log, 20))
	}
	return nil
}

// poll calls ready every 20 ms until it succeeds, p fails, or the
// deadline passes. ready's context ends when p exits, so a probe that
// reached some other process's listener does not wait out its timeout.
func poll(p *proc, deadline time.Time, what string, ready func(context.Context) error) error {
	for {
		if err := p.check(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		go func() {
			select {
			case <-p.exited:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := ready(ctx)
		cancel()
		if err == nil {
			return p.check()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pebble: %s did not answer: %w\n%s", what, err, tail(p.log, 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) waitChall(p *proc, deadline time.Time) error {
	return poll(p, deadline, "challtestsrv", func(ctx context.Context) error {
		// The management API first (its answer is challtestsrv's own: we
		// check the log for lost binds), then DNS over both transports.
		if err := s.challPost(ctx, "/clear-txt", map[string]string{"host": "keel-probe.invalid"}); err != nil {
			return err
		}
		for _, network := range []string{"udp", "tcp"} {
			r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, s.DNSAddr)
			}}
			if _, err := r.LookupHost(ctx, "keel-probe.invalid."); err != nil {
				return fmt.Errorf("DNS over %s: %w", network, err)
			}
		}
		return nil
	})
}

func (s *Server) waitPebble(p *proc, deadline time.Time) error {
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: s.DirectoryRoots},
	}}
	defer client.CloseIdleConnections()
	get := func(ctx context.Context, url string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return b, nil
	}
	return poll(p, deadline, "pebble", func(ctx context.Context) error {
		if _, err := get(ctx, s.DirectoryURL); err != nil {
			return err
		}
		roots, err := get(ctx, s.ManagementURL+"/roots/0")
		if err != nil {
			return err
		}
		inter, err := get(ctx, s.ManagementURL+"/intermediates/0")
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(roots) {
			return errors.New("pebble's root is not PEM")
		}
		s.IssuingRoots, s.IssuingRootsPEM, s.IntermediatesPEM = pool, roots, inter
		return nil
	})
}

// challPost posts a JSON request to challtestsrv's management API.
func (s *Server) challPost(ctx context.Context, path string, body any) error {
	js, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.ChallURL+path, bytes.NewReader(js))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("challtestsrv %s: %s %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// challSet is challPost for the exported helpers, bounded by 10 s.
func (s *Server) challSet(path string, body any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.challPost(ctx, path, body); err != nil {
		return fmt.Errorf("pebble: %w", err)
	}
	return nil
}

// SetDefaultIPv4 makes challtestsrv answer A queries without a record of
// their own with ip ("" answers none).
func (s *Server) SetDefaultIPv4(ip string) error {
	return s.challSet("/set-default-ipv4", map[string]string{"ip": ip})
}

// AddA makes challtestsrv answer A queries for host with ips.
func (s *Server) AddA(host string, ips ...string) error {
	return s.challSet("/add-a", map[string]any{"host": host, "addresses": ips})
}

// SetTXT adds value to the TXT records challtestsrv answers for host (a
// DNS-01 record is named _acme-challenge.<domain>).
func (s *Server) SetTXT(host, value string) error {
	return s.challSet("/set-txt", map[string]string{"host": host, "value": value})
}

// ClearTXT removes every TXT record of host.
func (s *Server) ClearTXT(host string) error {
	return s.challSet("/clear-txt", map[string]string{"host": host})
}

// Close kills both processes and waits for them. It is safe to call more
// than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		for i := len(s.procs) - 1; i >= 0; i-- {
			s.procs[i].stop()
		}
		s.http.CloseIdleConnections()
	})
	return nil
}

// Logs returns the last n lines of both processes' logs, for a failing
// test to show.
func (s *Server) Logs(n int) string {
	return "pebble.log:\n" + tail(s.PebbleLog, n) + "\nchalltestsrv.log:\n" + tail(s.ChallLog, n)
}

func tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
