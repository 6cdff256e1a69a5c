package sync

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/render"
)

// ReportNamespace is the sshsig namespace of report signatures, so that a
// report signature can never pass for a commit signature or the reverse.
const ReportNamespace = "keel-report"

// SigFileName is the detached signature of report.yaml, in the same commit.
const SigFileName = "report.yaml.sig"

// ReportKeys maps each node that has a reportKey (nodes/<name>.yaml) to its
// public key: such a node's reports count only when signed by it.
type ReportKeys map[string]ssh.PublicKey

// ReportKeysOf reads the report keys of the inventory.
func ReportKeysOf(m *render.Model) (ReportKeys, error) {
	keys := ReportKeys{}
	for _, n := range m.Nodes {
		if n.ReportKey == "" {
			continue
		}
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(n.ReportKey))
		if err != nil {
			return nil, fmt.Errorf("nodes/%s.yaml: spec.reportKey: %w", n.Name, err)
		}
		keys[n.Name] = k
	}
	return keys, nil
}

// LoadReportSigner reads the node's private key (OpenSSH format, not
// encrypted) that signs its reports.
func LoadReportSigner(file string) (ssh.Signer, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	s, err := ssh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("report key %s: %w", file, err)
	}
	return s, nil
}

// SignReport returns the armored sshsig signature of a report.
func SignReport(data []byte, signer ssh.Signer) ([]byte, error) {
	return sign(data, signer, ReportNamespace)
}

// VerifyReport checks a report's detached signature against the node's key.
func VerifyReport(data, sig []byte, key ssh.PublicKey) error {
	return verify(data, sig, key, ReportNamespace)
}

// sign returns the armored sshsig signature of data by a node's report
// key, in namespace (one per kind of file, so that no signature passes
// for another kind's).
func sign(data []byte, signer ssh.Signer, namespace string) ([]byte, error) {
	sig, err := sshsig.Sign(bytes.NewReader(data), signer, sshsig.HashSHA512, namespace)
	if err != nil {
		return nil, err
	}
	return sshsig.Armor(sig), nil
}

// verify checks a detached signature of data in namespace against a
// node's report key.
func verify(data, sig []byte, key ssh.PublicKey, namespace string) error {
	if len(sig) == 0 {
		return errors.New("not signed, but the node has a reportKey")
	}
	s, err := sshsig.Unarmor(sig)
	if err != nil {
		return fmt.Errorf("unreadable signature: %w", err)
	}
	if err := sshsig.Verify(bytes.NewReader(data), s, key, s.HashAlgorithm, namespace); err != nil {
		return fmt.Errorf("bad signature: %w", err)
	}
	return nil
}
