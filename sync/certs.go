package sync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/providers/certshare"
	"github.com/keel-dev/keel/render"
)

// CertRefPrefix is where the shared certificates are published, one ref
// per Ingress host: refs/keel/certs/<host>. Like the report refs, each is
// a single commit without parents, force-pushed, so no history grows; it
// is outside the report prefix, so reading reports never sees one.
const CertRefPrefix = render.CertRefPrefix

// RemoteCertPrefix is where the certificate refs fetched from remote land
// (refs/keel/remotes/<remote>/certs/<host>), as RemoteReportPrefix is for
// reports.
func RemoteCertPrefix(remote string) string {
	return "refs/keel/remotes/" + remote + "/certs/"
}

// CertNamespace is the sshsig namespace of cert.yaml signatures, so that
// a certificate's signature never passes for a report's or a commit's.
const CertNamespace = "keel-cert"

// CertSigFileName is the detached signature of cert.yaml, in the same
// commit.
const CertSigFileName = certshare.MetaFile + ".sig"

// CertRef returns the ref the shared certificate of host is published on,
// or an error when host is not a valid Ingress host (so that nothing such
// as "..", "/" or an uppercase name reaches a ref name).
func CertRef(host string) (plumbing.ReferenceName, error) {
	if err := certshare.CheckHost(host); err != nil {
		return "", err
	}
	return plumbing.ReferenceName(CertRefPrefix + host), nil
}

// SignCert returns the armored sshsig signature of a cert.yaml.
func SignCert(data []byte, signer ssh.Signer) ([]byte, error) {
	return sign(data, signer, CertNamespace)
}

// VerifyCert checks a cert.yaml's detached signature against the
// publishing node's report key.
func VerifyCert(data, sig []byte, key ssh.PublicKey) error {
	return verify(data, sig, key, CertNamespace)
}

// PublishCert force-pushes s to CertRef(s.Meta.Host) as a commit without
// parents holding cert.yaml, bundle.age (when s has a certificate) and
// cert.yaml.sig, signed with signer (the report key of the node
// s.Meta.PublishedBy; nil for a node without one). s is checked first, so
// that nothing readers would refuse is published.
func (m *Mirror) PublishCert(ctx context.Context, s certshare.Sealed, signer ssh.Signer, when time.Time) (plumbing.Hash, error) {
	if err := s.Check(); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("publish certificate: %w", err)
	}
	ref, err := CertRef(s.Meta.Host)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	data, err := s.Meta.Marshal()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	files := []publishedFile{{certshare.MetaFile, data}}
	if s.Bundle != nil {
		files = append(files, publishedFile{certshare.BundleFile, s.Bundle})
	}
	if signer != nil {
		sig, err := SignCert(data, signer)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("sign the certificate of %s: %w", s.Meta.Host, err)
		}
		files = append(files, publishedFile{CertSigFileName, sig})
	}
	return m.publishFiles(ctx, ref, files, s.Meta.PublishedBy, "certificate of "+s.Meta.Host, when)
}

// SharedCert is a shared certificate read from the repository.
type SharedCert struct {
	certshare.Sealed
	Ref    plumbing.ReferenceName
	Commit plumbing.Hash
	// Signed is set when cert.yaml's signature was checked against its
	// publisher's reportKey; a publisher without one publishes unsigned.
	Signed bool
}

// Certs reads the shared certificates the mirror holds (ReadCerts).
func (m *Mirror) Certs(publishers []string, keys ReportKeys) (map[string]SharedCert, []string, error) {
	return ReadCerts(m.repo, publishers, keys)
}

// ReadCerts reads the shared certificates found in repo, on the local
// refs (CertRefPrefix) and on those fetched from remotes
// (RemoteCertPrefix), keyed by host. A certificate counts only when
//   - its cert.yaml names the host of its ref, and parses strictly;
//   - its publisher is one of publishers (the names of the inventory's
//     render.Model.IngressNodes): like a report from a node outside the
//     inventory, anything else is ignored;
//   - when the publisher has a report key in keys, cert.yaml.sig is that
//     key's signature of cert.yaml (whose bundleSHA256 covers
//     bundle.age); a publisher without one publishes unsigned, as its
//     reports are;
//   - bundle.age is there, bounded and the one cert.yaml's hash names,
//     exactly when cert.yaml holds a certificate.
//
// Every object is refused from its header when it is larger than it can
// be. A ref that fails is skipped and described in problems; it never
// stops the others. When several refs hold one host (the local ref and a
// fetched one), the most recently published wins.
func ReadCerts(repo *git.Repository, publishers []string, keys ReportKeys) (certs map[string]SharedCert, problems []string, err error) {
	allowed := make(map[string]bool, len(publishers))
	for _, n := range publishers {
		allowed[n] = true
	}
	refs, err := repo.References()
	if err != nil {
		return nil, nil, fmt.Errorf("list refs: %w", err)
	}
	defer refs.Close()
	certs = map[string]SharedCert{}
	err = refs.ForEach(func(ref *plumbing.Reference) error {
		name := ref.Name().String()
		host, ok := strings.CutPrefix(name, CertRefPrefix)
		if !ok {
			// refs/keel/remotes/<remote>/certs/<host>; a remote's name
			// may itself contain slashes.
			rest, remote := strings.CutPrefix(name, "refs/keel/remotes/")
			i := strings.LastIndex(rest, "/certs/")
			if !remote || i < 0 {
				return nil
			}
			host = rest[i+len("/certs/"):]
		}
		// A name ending in .lock is git writing a ref; one with a slash
		// is another kind of ref under a remote named .../certs.
		if strings.Contains(host, "/") || strings.HasSuffix(host, ".lock") || ref.Type() != plumbing.HashReference {
			return nil
		}
		c, err := readCert(repo, ref, host, allowed, keys)
		if err != nil {
			problems = append(problems, fmt.Sprintf("certificate of %.253q on %s ignored: %v", host, name, err))
			return nil
		}
		if old, ok := certs[host]; ok && (old.Meta.Published.After(c.Meta.Published) || old.Meta.Published.Equal(c.Meta.Published) && old.Ref < c.Ref) {
			return nil
		}
		certs[host] = c
		return nil
	})
	return certs, problems, err
}

// readCert reads and checks the certificate commit ref points at,
// published for host.
func readCert(repo *git.Repository, ref *plumbing.Reference, host string, allowed map[string]bool, keys ReportKeys) (SharedCert, error) {
	if err := certshare.CheckHost(host); err != nil {
		return SharedCert{}, fmt.Errorf("the ref does not name a host: %w", err)
	}
	files, err := openPublished(repo, ref.Hash())
	if err != nil {
		return SharedCert{}, err
	}
	notFound := func(err error) bool {
		return errors.Is(err, object.ErrEntryNotFound) || errors.Is(err, object.ErrDirectoryNotFound)
	}
	data, err := files.read(certshare.MetaFile, certshare.MaxMetaSize)
	if notFound(err) {
		return SharedCert{}, fmt.Errorf("no %s in commit %s", certshare.MetaFile, ref.Hash())
	}
	if err != nil {
		return SharedCert{}, err
	}
	meta, err := certshare.ParseMeta(data)
	if err != nil {
		return SharedCert{}, err
	}
	if meta.Host != host {
		return SharedCert{}, fmt.Errorf("%s names host %q but is published for %q", certshare.MetaFile, meta.Host, host)
	}
	by := meta.PublishedBy
	if !allowed[by] {
		return SharedCert{}, fmt.Errorf("published by node %s, which is not an ingress node of the inventory", by)
	}
	out := SharedCert{Ref: ref.Name(), Commit: ref.Hash()}
	if key := keys[by]; key != nil {
		sig, err := files.read(CertSigFileName, MaxSignatureSize)
		if err != nil && !notFound(err) {
			return SharedCert{}, err
		}
		if err := VerifyCert(data, sig, key); err != nil {
			return SharedCert{}, fmt.Errorf("published by node %s: %w", by, err)
		}
		out.Signed = true
	}
	bundle, err := files.read(certshare.BundleFile, certshare.MaxSealedSize)
	if err != nil && !notFound(err) {
		return SharedCert{}, err
	}
	out.Sealed = certshare.Sealed{Meta: meta, Bundle: bundle}
	if err := out.Check(); err != nil {
		return SharedCert{}, err
	}
	return out, nil
}
