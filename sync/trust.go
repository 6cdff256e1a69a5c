package sync

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"
)

// AllowedSigner is one line of an OpenSSH allowed_signers file: who may
// sign (principal patterns), for which namespaces, with which key.
type AllowedSigner struct {
	Principals []string
	Namespaces []string // empty: any namespace
	Key        ssh.PublicKey
	Line       int
}

// AllowedSigners is the keys allowed to sign deployable commits. It comes
// from node-local configuration, never from the repository.
type AllowedSigners []AllowedSigner

// ParseAllowedSigners reads an OpenSSH allowed_signers file (ssh-keygen(1),
// ALLOWED SIGNERS): "principals [options] keytype base64 [comment]", with
// the namespaces="..." option honoured. Certificate authorities are not
// supported and are refused.
func ParseAllowedSigners(r io.Reader) (AllowedSigners, error) {
	var out AllowedSigners
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		principals, rest, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("allowed signers line %d: want principals, then a key", n)
		}
		rest = strings.TrimSpace(rest)
		s := AllowedSigner{Principals: strings.Split(principals, ","), Line: n}
		// Options come before the key when the next word is not a key type.
		if first, _, _ := strings.Cut(rest, " "); !isKeyType(first) {
			opts, keyPart := splitOptions(rest)
			for _, o := range opts {
				name, value, _ := strings.Cut(o, "=")
				switch strings.ToLower(name) {
				case "namespaces":
					s.Namespaces = strings.Split(strings.Trim(value, `"`), ",")
				case "cert-authority":
					return nil, fmt.Errorf("allowed signers line %d: cert-authority is not supported; list the signing keys themselves", n)
				case "valid-after", "valid-before":
					return nil, fmt.Errorf("allowed signers line %d: %s is not supported", n, name)
				default:
					return nil, fmt.Errorf("allowed signers line %d: unknown option %q", n, name)
				}
			}
			rest = keyPart
		}
		key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(rest))
		if err != nil {
			return nil, fmt.Errorf("allowed signers line %d: %w", n, err)
		}
		s.Key = key
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("the allowed signers file lists no key")
	}
	return out, nil
}

// LoadAllowedSigners reads an allowed_signers file.
func LoadAllowedSigners(file string) (AllowedSigners, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := ParseAllowedSigners(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return s, nil
}

func isKeyType(s string) bool {
	return strings.HasPrefix(s, "ssh-") || strings.HasPrefix(s, "ecdsa-") || strings.HasPrefix(s, "sk-")
}

// splitOptions splits "opt1,opt2=\"a,b\" keytype key" into its options and
// the key part, honouring quotes.
func splitOptions(s string) ([]string, string) {
	var opts []string
	var cur strings.Builder
	quoted := false
	for i, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case r == ',' && !quoted:
			opts = append(opts, cur.String())
			cur.Reset()
		case r == ' ' && !quoted:
			opts = append(opts, cur.String())
			return opts, strings.TrimSpace(s[i:])
		default:
			cur.WriteRune(r)
		}
	}
	return append(opts, cur.String()), ""
}

// ErrUnsigned is returned for a commit that carries no signature.
var ErrUnsigned = errors.New("the commit is not signed")

// Verify checks that commit c carries an SSH signature (the sshsig format
// git makes with gpg.format=ssh) in namespace "git", by a key of s listed
// for a principal that matches the committer's email. It returns that
// principal.
func (s AllowedSigners) Verify(c *object.Commit) (string, error) {
	if c.PGPSignature == "" {
		return "", ErrUnsigned
	}
	if !strings.HasPrefix(strings.TrimSpace(c.PGPSignature), "-----BEGIN SSH SIGNATURE-----") {
		return "", errors.New("the commit has an OpenPGP signature; only SSH signatures are checked against allowed signers")
	}
	sig, err := sshsig.Unarmor([]byte(c.PGPSignature))
	if err != nil {
		return "", fmt.Errorf("unreadable signature: %w", err)
	}
	msg, err := signedPayload(c)
	if err != nil {
		return "", err
	}
	fp := ssh.FingerprintSHA256(sig.PublicKey)
	email := c.Committer.Email
	known := false
	for _, a := range s {
		if ssh.FingerprintSHA256(a.Key) != fp {
			continue
		}
		known = true
		if len(a.Namespaces) > 0 && !matchAny(a.Namespaces, "git") {
			continue
		}
		if !matchAny(a.Principals, email) {
			continue
		}
		if err := sshsig.Verify(bytes.NewReader(msg), sig, a.Key, sig.HashAlgorithm, "git"); err != nil {
			return "", fmt.Errorf("bad signature by %s: %w", fp, err)
		}
		return email, nil
	}
	if known {
		return "", fmt.Errorf("key %s may not sign for %s in namespace git (allowed signers: principals or namespaces do not match)", fp, email)
	}
	return "", fmt.Errorf("signed by %s, which is not an allowed signer", fp)
}

// matchAny reports whether s matches one of the patterns (* and ?, as in
// allowed_signers; a leading ! negates).
func matchAny(patterns []string, s string) bool {
	ok := false
	for _, p := range patterns {
		neg := strings.HasPrefix(p, "!")
		if m, _ := path.Match(strings.TrimPrefix(p, "!"), s); m {
			if neg {
				return false
			}
			ok = true
		}
	}
	return ok
}

// signedPayload is what a commit signature covers: the commit object
// without its gpgsig header.
func signedPayload(c *object.Commit) ([]byte, error) {
	obj := &plumbing.MemoryObject{}
	if err := c.EncodeWithoutSignature(obj); err != nil {
		return nil, err
	}
	r, err := obj.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// Signers verifies commit signatures of both kinds git makes: SSH ones
// against an allowed_signers file, OpenPGP ones against an armored keyring.
// Either may be empty, and a signature of that kind is then refused.
type Signers struct {
	SSH AllowedSigners
	// PGPKeyring is an ASCII-armored OpenPGP public keyring.
	PGPKeyring string
}

// LoadSigners reads the allowed_signers file and the OpenPGP keyring (each
// optional, at least one required).
func LoadSigners(allowedSigners, pgpKeyring string) (Signers, error) {
	var s Signers
	if allowedSigners == "" && pgpKeyring == "" {
		return s, errors.New("give --allowed-signers (SSH) or --pgp-keyring (OpenPGP), or both")
	}
	if allowedSigners != "" {
		ssh, err := LoadAllowedSigners(allowedSigners)
		if err != nil {
			return s, err
		}
		s.SSH = ssh
	}
	if pgpKeyring != "" {
		data, err := os.ReadFile(pgpKeyring)
		if err != nil {
			return s, err
		}
		if !strings.Contains(string(data), "-----BEGIN PGP PUBLIC KEY BLOCK-----") {
			return s, fmt.Errorf("%s is not an ASCII-armored OpenPGP public keyring (gpg --export --armor)", pgpKeyring)
		}
		s.PGPKeyring = string(data)
	}
	return s, nil
}

// Verify checks c's signature, SSH or OpenPGP, and that the signer may sign
// for the committer: an SSH key listed for a principal matching the
// committer's email, or an OpenPGP key with a user ID of that email. It
// returns the committer's email.
func (s Signers) Verify(c *object.Commit) (string, error) {
	sig := strings.TrimSpace(c.PGPSignature)
	switch {
	case sig == "":
		return "", ErrUnsigned
	case strings.HasPrefix(sig, "-----BEGIN SSH SIGNATURE-----"):
		if len(s.SSH) == 0 {
			return "", errors.New("the commit has an SSH signature, and no allowed signers file is configured")
		}
		return s.SSH.Verify(c)
	case strings.HasPrefix(sig, "-----BEGIN PGP SIGNATURE-----"):
		if s.PGPKeyring == "" {
			return "", errors.New("the commit has an OpenPGP signature, and no OpenPGP keyring is configured")
		}
		entity, err := c.Verify(s.PGPKeyring)
		if err != nil {
			return "", fmt.Errorf("bad or unknown OpenPGP signature: %w", err)
		}
		email := c.Committer.Email
		for _, id := range entity.Identities {
			if id.UserId != nil && strings.EqualFold(id.UserId.Email, email) {
				return email, nil
			}
		}
		return "", fmt.Errorf("OpenPGP key %X may not sign for %s (no user ID with that email)", entity.PrimaryKey.Fingerprint, email)
	}
	return "", errors.New("unknown signature format")
}
