package sync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// Remote says where a cluster repository lives and how to reach it.
// Credentials come from files, never from the URL or the repository.
type Remote struct {
	// URL is file://..., a local path, https://... or ssh://... (or
	// scp-like user@host:path).
	URL string
	// Branch is the branch that holds the specs; empty for a repository
	// that only holds reports.
	Branch string
	// SSHKeyFile and KnownHostsFile authenticate over SSH.
	SSHKeyFile     string
	KnownHostsFile string
	// TokenFile holds a token for HTTPS (sent as the basic-auth password).
	TokenFile string
	// FullHistory fetches the branch's whole history instead of its tip
	// (needed to tell that a new tip descends from the last applied one).
	FullHistory bool
}

// Auth returns the transport authentication the remote's files describe.
func (r Remote) Auth() (transport.AuthMethod, error) {
	switch {
	case r.SSHKeyFile != "":
		user := "git"
		if ep, err := transport.NewEndpoint(r.URL); err == nil && ep.User != "" {
			user = ep.User
		}
		keys, err := gitssh.NewPublicKeysFromFile(user, r.SSHKeyFile, "")
		if err != nil {
			return nil, fmt.Errorf("ssh key %s: %w", r.SSHKeyFile, err)
		}
		if r.KnownHostsFile == "" {
			return nil, errors.New("an SSH key needs a known_hosts file (--known-hosts): keel never trusts an unknown host key")
		}
		cb, err := gitssh.NewKnownHostsCallback(r.KnownHostsFile)
		if err != nil {
			return nil, fmt.Errorf("known hosts %s: %w", r.KnownHostsFile, err)
		}
		keys.HostKeyCallback = cb
		return keys, nil
	case r.TokenFile != "":
		data, err := os.ReadFile(r.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		token := strings.TrimSpace(string(data))
		if token == "" {
			return nil, fmt.Errorf("token file %s is empty", r.TokenFile)
		}
		return &http.BasicAuth{Username: "keel", Password: token}, nil
	}
	return nil, nil
}

// CheckURL refuses URLs that carry credentials: they would end up in logs,
// process listings and the clone's config.
func CheckURL(raw string) error {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if _, hasPassword := u.User.Password(); hasPassword || u.Scheme == "https" || u.Scheme == "http" {
			return errors.New("the repository URL must not carry credentials: give them with --token-file or --ssh-key")
		}
	}
	return nil
}

// Redacted returns the URL without any user information, for logs.
func Redacted(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil && u.Scheme != "" {
		u.User = nil
		return u.String()
	}
	return raw
}

// Mirror is the agent's bare clone of a cluster repository: the spec
// branch, shallow, and every node's report ref.
type Mirror struct {
	dir          string
	remote       Remote
	reportPrefix string
	auth         transport.AuthMethod
	repo         *git.Repository
	// writes counts the fetches and publications since the mirror was
	// made or last compacted.
	writes int
	// size is the mirror's size on disk after the last fetch or
	// publication; baseline its size when it was made or last compacted.
	size, baseline int64
	// walkedAt is writes at the last walk of the mirror (measure), and
	// packs the files of objects/pack counted in size since.
	walkedAt int
	packs    map[string]bool
	// skipped are the refs the last fetch left out (fetchAround).
	skipped map[plumbing.ReferenceName]SkippedRef
	// failedCompactions counts the compactions that failed in a row; the
	// next is not tried before writes reaches retryCompactionAt.
	failedCompactions, retryCompactionAt int
}

// maxCompactionBackoff bounds how many fetches a failed compaction waits
// before it is tried again (5, 10, 20, 40, 40, ... fetches).
const maxCompactionBackoff = 40

// A mirror compacts itself (NeedsCompaction) after compactEvery fetches or
// publications (each fetch leaves a pack; each publication leaves a few
// loose objects; the shallow list no longer grows: trimShallow), and as
// soon as its size on disk passes CompactBound of its size when last made
// or compacted: a fetch keeps the packs of every tip it brought, refused
// or not, so pushes of large files (unsigned ones, say) would otherwise
// fill the disk until the 500th fetch.
const compactEvery = 500

// MinCompactSize is the least size on disk a mirror may reach before it
// compacts itself, whatever its baseline.
const MinCompactSize = 64 << 20

// CompactBound is the size on disk past which a mirror that measured
// baseline bytes when made or last compacted compacts itself:
// max(MinCompactSize, 2 × baseline).
func CompactBound(baseline int64) int64 { return max(MinCompactSize, 2*baseline) }

// baselineFile, in the mirror's directory, keeps the baseline across
// restarts, so that reopening a grown mirror does not raise its bound.
const baselineFile = "keel-baseline-size"

// OpenMirror opens the mirror in dir, cloning the remote into it when it
// does not exist yet.
func OpenMirror(ctx context.Context, dir string, remote Remote, reportPrefix string) (*Mirror, error) {
	if err := CheckURL(remote.URL); err != nil {
		return nil, err
	}
	guardTransports()
	auth, err := remote.Auth()
	if err != nil {
		return nil, err
	}
	m := &Mirror{dir: dir, remote: remote, reportPrefix: reportPrefix, auth: auth}
	if err := finishCompaction(dir); err != nil {
		return nil, fmt.Errorf("open mirror %s: %w", dir, err)
	}
	if err := removeBrokenRefs(dir); err != nil {
		return nil, fmt.Errorf("open mirror %s: %w", dir, err)
	}
	repo, err := git.PlainOpen(dir)
	switch {
	case err == nil:
		m.repo = repo
	case !errors.Is(err, git.ErrRepositoryNotExists):
		return nil, fmt.Errorf("open mirror %s: %w", dir, err)
	default:
		if m.repo, err = m.initRepo(dir); err != nil {
			return nil, err
		}
	}
	m.measure()
	if b, err := os.ReadFile(filepath.Join(dir, baselineFile)); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n >= 0 {
			m.baseline = n
			return m, nil
		}
	}
	// A new mirror, or one made before baselines were kept: what it holds
	// now is its baseline.
	m.baseline = m.size
	if err := writeBaseline(dir, m.baseline); err != nil {
		return nil, fmt.Errorf("open mirror %s: %w", dir, err)
	}
	return m, nil
}

// finishCompaction puts right what a compaction killed half-way left (see
// Compact): the mirror moved to dir.old and the new one not yet in its
// place, or a new one half-fetched in dir.new.
func finishCompaction(dir string) error {
	old := dir + ".old"
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		if _, err := os.Lstat(old); err == nil {
			if err := os.Rename(old, dir); err != nil {
				return err
			}
		}
	}
	if err := os.RemoveAll(dir + ".new"); err != nil {
		return err
	}
	return os.RemoveAll(old)
}

// measure sets m.size to the mirror's size on disk: the sizes of its
// files, each rounded up to a 4 KiB block (a loose object of 100 bytes
// takes one). A file it cannot stat counts nothing.
func (m *Mirror) measure() {
	m.size, m.walkedAt, m.packs = dirSize(m.dir), m.writes, nil
	m.newPacks()
}

func dirSize(dir string) int64 {
	var size int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			size += (info.Size() + 4095) &^ 4095
		}
		return nil
	})
	return size
}

// Size returns the mirror's size on disk after its last fetch or
// publication, and its size when it was made or last compacted.
func (m *Mirror) Size() (now, baseline int64) { return m.size, m.baseline }

func writeBaseline(dir string, n int64) error {
	return os.WriteFile(filepath.Join(dir, baselineFile), []byte(strconv.FormatInt(n, 10)+"\n"), 0o600)
}

// removeBrokenRefs deletes the loose refs of the mirror in dir that do not
// hold a hash or a symbolic ref. go-git writes a ref in place (truncate,
// then write, no fsync), so an agent killed in between, or a power cut
// before the data reached the disk, leaves an empty file that every later
// fetch fails on, for good. The mirror is a cache of the remote: the next
// fetch, or the next report, writes those refs again.
func removeBrokenRefs(dir string) error {
	refs := filepath.Join(dir, "refs")
	err := filepath.WalkDir(refs, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s := strings.TrimSpace(string(b))
		if strings.HasPrefix(s, "ref: ") || (len(s) == 40 && plumbing.IsHash(s)) {
			return nil
		}
		return os.Remove(p)
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// initRepo makes an empty bare repository in dir with the remote "origin".
func (m *Mirror) initRepo(dir string) (*git.Repository, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	repo, err := git.PlainInit(dir, true)
	if err != nil {
		return nil, fmt.Errorf("init mirror %s: %w", dir, err)
	}
	if _, err := repo.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{m.remote.URL}}); err != nil {
		return nil, fmt.Errorf("init mirror: %w", err)
	}
	return repo, nil
}

// Refs is what a fetch found: the branch tip (zero when the mirror has no
// branch), the report refs and the shared certificates' refs.
type Refs struct {
	Tip     plumbing.Hash
	Reports map[string]plumbing.Hash // node → report commit
	Certs   map[string]plumbing.Hash // host → shared certificate commit
	// Refused is set when the remote's tip was left out of the fetch (its
	// objects break the fetch limits); Tip is then what the mirror had.
	Refused *SkippedRef
	// Skipped counts the report and certificate refs left out, each one
	// node's or host's problem.
	Skipped []string
}

// Equal reports whether two fetches found the same refs.
func (r Refs) Equal(o Refs) bool {
	return r.Tip == o.Tip && maps.Equal(r.Reports, o.Reports) && maps.Equal(r.Certs, o.Certs)
}

// Fetch brings the branch (depth 1, following force pushes), the report
// refs and the certificate refs (CertRefPrefix) up to date, deleting those
// gone from the remote, and returns them. A ref whose objects break the fetch
// limits (MaxObjectSize, ...) is left out, and the others are fetched
// around it: see fetchAround.
func (m *Mirror) Fetch(ctx context.Context) (Refs, error) {
	if len(m.skipped) == 0 {
		// Without the "+" of a forced refspec: m.fetch forces every update
		// anyway, and go-git's Prune reverses "+src:dst" into "dst:+src",
		// finds no local ref on the remote under that name and deletes
		// them all, to write them again (TestFetchRewritesOnlyChangedRefs).
		specs := []config.RefSpec{
			config.RefSpec(m.reportPrefix + "*:" + m.reportPrefix + "*"),
			config.RefSpec(CertRefPrefix + "*:" + CertRefPrefix + "*"),
		}
		if m.remote.Branch != "" {
			b := plumbing.NewBranchReferenceName(m.remote.Branch)
			specs = append(specs, config.RefSpec(b.String()+":"+b.String()))
		}
		err := m.fetch(ctx, specs, true)
		var tooLarge *ObjectTooLargeError
		if !errors.As(err, &tooLarge) {
			if err != nil {
				return Refs{}, err
			}
			m.fetched()
			return m.Refs()
		}
	}
	if err := m.fetchAround(ctx); err != nil {
		return Refs{}, err
	}
	m.fetched()
	return m.Refs()
}

// walkEvery is how many fetches and publications go between two walks of
// the whole mirror (measure); in between, fetched adds the packs that
// appeared.
const walkEvery = 50

// fetched counts a fetch or a publication, and measures the mirror: the
// packs new in objects/pack are added to its size (a fetch writes its
// objects as one pack, of up to MaxPackSize), and the whole directory is
// walked again every walkEvery writes, which counts the rest (the loose
// objects of publications, a few KiB each). Walking it at every write
// cost more than the fetch itself once a few hundred packs and loose
// objects were there, on the path of every fetch and push.
func (m *Mirror) fetched() {
	m.writes++
	if m.writes-m.walkedAt >= walkEvery {
		m.measure()
		return
	}
	m.size += m.newPacks()
}

// newPacks returns the size on disk of the files of objects/pack not seen
// at the last measure or call, and notes them.
func (m *Mirror) newPacks() int64 {
	entries, err := os.ReadDir(filepath.Join(m.dir, "objects", "pack"))
	if err != nil {
		return 0
	}
	if m.packs == nil {
		m.packs = map[string]bool{}
	}
	var added int64
	for _, e := range entries {
		if m.packs[e.Name()] {
			continue
		}
		if info, err := e.Info(); err == nil {
			added += (info.Size() + 4095) &^ 4095
			m.packs[e.Name()] = true
		}
	}
	return added
}

// notOurRefTries bounds the fetches of one Fetch that meet a ref moved
// between the advertisement and the wants. 50 nodes publishing and
// fetching at once over smart HTTP met it on one fetch in six; a few
// tries, spread by notOurRefPause, make three misses in a row rare.
const notOurRefTries = 5

// notOurRefPause is the pause before try number try (from 2): a random
// time up to 100 ms times the tries made, so that fetchers that met the
// same push do not advertise again in step with the next one.
func notOurRefPause(try int) time.Duration {
	return time.Duration(rand.Int64N(int64(100*time.Millisecond) * int64(try-1)))
}

func (m *Mirror) fetch(ctx context.Context, specs []config.RefSpec, prune bool) error {
	var err error
	for try := 1; ; try++ {
		err = m.repo.FetchContext(ctx, &git.FetchOptions{
			RemoteName: "origin", RefSpecs: specs, Depth: m.depth(), Tags: git.NoTags, Force: true, Auth: m.auth, Prune: prune,
		})
		// Over smart HTTP the refs are advertised in one request and the
		// objects asked for in the next: a node that force-pushes its
		// report in between makes the old hash "not our ref" to a server
		// at git's defaults, which refuses the whole fetch. A new fetch
		// gets a fresh advertisement.
		if err == nil || try == notOurRefTries || ctx.Err() != nil || !strings.Contains(err.Error(), "not our ref") {
			break
		}
		t := time.NewTimer(notOurRefPause(try + 1))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return fmt.Errorf("fetch %s: %w", Redacted(m.remote.URL), RedactURL(err))
	}
	return m.trimShallow()
}

// trimShallow keeps in the mirror's shallow list only the commits that
// have parents. A depth-1 fetch makes the server call every commit it
// sends shallow, the report and certificate commits too, and go-git adds
// them all to the list and sends the whole list with every later fetch:
// thousands of lines, hundreds of KB per request and seconds of server
// CPU after a few dozen fetches at 150 nodes. A commit without parents
// has no history to cut, so it never needs to be shallow; a commit the
// mirror no longer holds has nothing to say either.
func (m *Mirror) trimShallow() error {
	list, err := m.repo.Storer.Shallow()
	if err != nil || len(list) == 0 {
		return err
	}
	keep := make([]plumbing.Hash, 0, 1)
	for _, h := range list {
		if c, err := m.Commit(h); err == nil && c.NumParents() > 0 {
			keep = append(keep, h)
		}
	}
	if len(keep) == len(list) {
		return nil
	}
	if err := m.repo.Storer.SetShallow(keep); err != nil {
		return fmt.Errorf("mirror %s: shallow list: %w", m.dir, err)
	}
	return nil
}

// fetchAround fetches the branch, the report and the certificate refs the
// remote lists,
// leaving out every ref whose objects break the fetch limits: it fetches
// them in groups, halving a group that is refused until the refs to leave
// out are found (a few fetches per bad ref), and remembers those refs at
// their hashes so that later fetches name every other ref at once. A ref
// left out keeps what the mirror had (a report stays as old as it was; a
// refused tip is in Refs.Refused), so that one bad ref never stops the
// others from being read.
func (m *Mirror) fetchAround(ctx context.Context) error {
	listed, err := m.list(ctx)
	if err != nil {
		return err
	}
	present := map[plumbing.ReferenceName]bool{}
	var want []*plumbing.Reference
	skipped := map[plumbing.ReferenceName]SkippedRef{}
	for _, r := range listed {
		name := r.Name()
		present[name] = true
		if s, ok := m.skipped[name]; ok && s.Hash == r.Hash() {
			skipped[name] = s
			continue
		}
		want = append(want, r)
	}
	if err := m.fetchGroups(ctx, want, skipped); err != nil {
		return err
	}
	m.skipped = skipped
	return m.prune(present)
}

// list returns the refs of the remote the mirror keeps (the branch, the
// reports and the certificates), from one advertisement.
func (m *Mirror) list(ctx context.Context) ([]*plumbing.Reference, error) {
	remote, err := m.repo.Remote("origin")
	if err != nil {
		return nil, err
	}
	listed, err := remote.ListContext(ctx, &git.ListOptions{Auth: m.auth})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Redacted(m.remote.URL), RedactURL(err))
	}
	branch := plumbing.NewBranchReferenceName(m.remote.Branch)
	var out []*plumbing.Reference
	for _, r := range listed {
		name := r.Name()
		if r.Type() != plumbing.HashReference || (name != branch || m.remote.Branch == "") && !m.peerRef(name) {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// fetchGroups fetches refs, each under its own name, leaving out those
// whose objects break the fetch limits: it halves a refused group until
// the refs to leave out are found, and records them in skipped.
func (m *Mirror) fetchGroups(ctx context.Context, refs []*plumbing.Reference, skipped map[plumbing.ReferenceName]SkippedRef) error {
	if len(refs) == 0 {
		return nil
	}
	specs := make([]config.RefSpec, len(refs))
	for i, r := range refs {
		specs[i] = config.RefSpec("+" + r.Name().String() + ":" + r.Name().String())
	}
	err := m.fetch(ctx, specs, false)
	var tooLarge *ObjectTooLargeError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &tooLarge):
		return err
	case len(refs) == 1:
		skipped[refs[0].Name()] = SkippedRef{Hash: refs[0].Hash(), Reason: tooLarge.Reason}
		return nil
	}
	half := len(refs) / 2
	if err := m.fetchGroups(ctx, refs[:half], skipped); err != nil {
		return err
	}
	return m.fetchGroups(ctx, refs[half:], skipped)
}

// prune deletes by hand the report and certificate refs gone from the
// remote (those not in present), and those left out (m.skipped): a
// report's old content would say the node is as it was; an old
// certificate would be served as if it were the newest.
func (m *Mirror) prune(present map[plumbing.ReferenceName]bool) error {
	local, err := m.repo.References()
	if err != nil {
		return err
	}
	defer local.Close()
	return local.ForEach(func(r *plumbing.Reference) error {
		name := r.Name()
		if !m.peerRef(name) {
			return nil
		}
		if _, left := m.skipped[name]; present[name] && !left {
			return nil
		}
		return m.repo.Storer.RemoveReference(name)
	})
}

// FetchChanged brings up to date only what changed, with the guarantees of
// Fetch (the fetch limits, refs fetched around a refused one, the not-our-ref
// retry, redacted errors): it lists the remote's refs once, fetches the
// branch when its tip moved, and a report or certificate ref when it moved
// and want (nil: every ref) says so, and deletes the refs gone from the
// remote. A ref that moved but is not wanted keeps what the mirror had.
// When nothing is to be fetched, the advertisement is the only request:
// the agent calls it at every poll and at every change notice, wanting the
// reports whose content changed.
//
// It returns the mirror's refs, as Fetch does.
func (m *Mirror) FetchChanged(ctx context.Context, want func(ref plumbing.ReferenceName, remote plumbing.Hash) bool) (Refs, error) {
	branch := plumbing.NewBranchReferenceName(m.remote.Branch)
	for try := 1; ; try++ {
		listed, err := m.list(ctx)
		if err != nil {
			return Refs{}, err
		}
		present := map[plumbing.ReferenceName]bool{}
		var fetch []*plumbing.Reference
		for _, r := range listed {
			name := r.Name()
			present[name] = true
			if s, ok := m.skipped[name]; ok && s.Hash == r.Hash() {
				continue // still refused at that hash
			}
			if local, err := m.repo.Storer.Reference(name); err == nil && local.Hash() == r.Hash() {
				continue
			}
			if name != branch && want != nil && !want(name, r.Hash()) {
				continue
			}
			fetch = append(fetch, r)
		}
		skipped := map[plumbing.ReferenceName]SkippedRef{}
		for name, s := range m.skipped {
			if present[name] {
				skipped[name] = s
			}
		}
		for _, r := range fetch {
			delete(skipped, r.Name()) // tried again at its new hash
		}
		err = m.fetchGroups(ctx, fetch, skipped)
		// A ref deleted between the listing and the fetch's own
		// advertisement: list again.
		if errors.Is(err, git.NoMatchingRefSpecError{}) && try < notOurRefTries && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return Refs{}, err
		}
		m.skipped = skipped
		if err := m.prune(present); err != nil {
			return Refs{}, err
		}
		if len(fetch) > 0 {
			m.fetched()
		}
		return m.Refs()
	}
}

// peerRef reports whether name is a ref the nodes publish: a report or a
// shared certificate.
func (m *Mirror) peerRef(name plumbing.ReferenceName) bool {
	return strings.HasPrefix(name.String(), m.reportPrefix) || strings.HasPrefix(name.String(), CertRefPrefix)
}

// SkippedRef is a ref a fetch left out, at the hash it had, and why.
type SkippedRef struct {
	Hash   plumbing.Hash
	Reason string
}

func (m *Mirror) depth() int {
	if m.remote.FullHistory {
		return 0
	}
	return 1
}

// Refs returns what the mirror holds now, without fetching.
func (m *Mirror) Refs() (Refs, error) {
	out := Refs{Reports: map[string]plumbing.Hash{}, Certs: map[string]plumbing.Hash{}}
	if m.remote.Branch != "" {
		ref, err := m.repo.Reference(plumbing.NewBranchReferenceName(m.remote.Branch), true)
		switch {
		case err == nil:
			out.Tip = ref.Hash()
		case !errors.Is(err, plumbing.ErrReferenceNotFound):
			return Refs{}, err
		}
	}
	for name, s := range m.skipped {
		if name == plumbing.NewBranchReferenceName(m.remote.Branch) {
			out.Refused = &s
		} else {
			what := "report ref"
			if strings.HasPrefix(name.String(), CertRefPrefix) {
				what = "certificate ref"
			}
			out.Skipped = append(out.Skipped, fmt.Sprintf("%s %s at %.12s left out of the fetch: %s", what, name, s.Hash, s.Reason))
		}
	}
	slices.Sort(out.Skipped)
	iter, err := m.repo.References()
	if err != nil {
		return Refs{}, err
	}
	defer iter.Close()
	err = iter.ForEach(func(r *plumbing.Reference) error {
		if r.Type() != plumbing.HashReference {
			return nil
		}
		if node, ok := strings.CutPrefix(r.Name().String(), m.reportPrefix); ok {
			out.Reports[node] = r.Hash()
		} else if host, ok := strings.CutPrefix(r.Name().String(), CertRefPrefix); ok {
			out.Certs[host] = r.Hash()
		}
		return nil
	})
	return out, err
}

// Commit returns a commit of the mirror.
// Its size is checked from the object's header first.
func (m *Mirror) Commit(h plumbing.Hash) (*object.Commit, error) {
	return readCommit(m.repo.Storer, h)
}

// Reports reads the reports the mirror holds; those of nodes with a report
// key count only when signed by it.
func (m *Mirror) Reports(keys ReportKeys) ([]report.Report, []string, error) {
	return ReadVerifiedReports(m.repo, m.reportPrefix, keys)
}

// Publish force-pushes data as report.yaml, the only file of a new commit
// without parents, to <reportPrefix><node>: one ref per node, so that no
// push contends with another node's, and no history grows.
func (m *Mirror) Publish(ctx context.Context, node string, data []byte, when time.Time) (plumbing.Hash, error) {
	return m.PublishSigned(ctx, node, data, nil, when)
}

// PublishSigned is Publish with a detached signature of data, published
// next to it as report.yaml.sig when not nil.
func (m *Mirror) PublishSigned(ctx context.Context, node string, data, sig []byte, when time.Time) (plumbing.Hash, error) {
	files := []publishedFile{{report.FileName, data}}
	if sig != nil {
		files = append(files, publishedFile{SigFileName, sig})
	}
	return m.publishFiles(ctx, ReportRef(m.reportPrefix, node), files, node, "report of "+node, when)
}

// publishedFile is a file of a published commit.
type publishedFile struct {
	name string
	data []byte
}

// publishFiles writes files as the whole tree of a new commit without
// parents, by node at when, points ref at it and force-pushes ref alone:
// the reports and the shared certificates are published this way, one ref
// each, so that no push contends with another node's and no history grows.
func (m *Mirror) publishFiles(ctx context.Context, ref plumbing.ReferenceName, files []publishedFile, node, message string, when time.Time) (plumbing.Hash, error) {
	st := m.repo.Storer
	writeBlob := func(b []byte) (plumbing.Hash, error) {
		blob := st.NewEncodedObject()
		blob.SetType(plumbing.BlobObject)
		w, err := blob.Writer()
		if err != nil {
			return plumbing.ZeroHash, err
		}
		if _, err := w.Write(b); err != nil {
			return plumbing.ZeroHash, err
		}
		if err := w.Close(); err != nil {
			return plumbing.ZeroHash, err
		}
		return st.SetEncodedObject(blob)
	}
	tree := &object.Tree{}
	for _, f := range files {
		h, err := writeBlob(f.data)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		tree.Entries = append(tree.Entries, object.TreeEntry{Name: f.name, Mode: filemode.Regular, Hash: h})
	}
	// git orders a tree's entries by name (files only here: no "/" rule).
	slices.SortFunc(tree.Entries, func(a, b object.TreeEntry) int { return strings.Compare(a.Name, b.Name) })
	treeObj := st.NewEncodedObject()
	if err := tree.Encode(treeObj); err != nil {
		return plumbing.ZeroHash, err
	}
	treeHash, err := st.SetEncodedObject(treeObj)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	who := object.Signature{Name: "keel " + node, Email: node + "@keel.invalid", When: when.UTC()}
	commit := &object.Commit{Author: who, Committer: who, Message: message + "\n", TreeHash: treeHash}
	commitObj := st.NewEncodedObject()
	if err := commit.Encode(commitObj); err != nil {
		return plumbing.ZeroHash, err
	}
	commitHash, err := st.SetEncodedObject(commitObj)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if err := st.SetReference(plumbing.NewHashReference(ref, commitHash)); err != nil {
		return plumbing.ZeroHash, err
	}
	err = m.repo.PushContext(ctx, &git.PushOptions{
		RemoteName: "origin", RefSpecs: []config.RefSpec{config.RefSpec("+" + ref.String() + ":" + ref.String())}, Auth: m.auth, Force: true,
	})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return plumbing.ZeroHash, fmt.Errorf("push %s to %s: %w", ref, Redacted(m.remote.URL), RedactURL(err))
	}
	m.fetched()
	return commitHash, nil
}

// NeedsCompaction reports whether the mirror should be compacted: it has
// fetched or published compactEvery times, or its size on disk is past
// CompactBound of its baseline.
func (m *Mirror) NeedsCompaction() bool {
	if m.writes < m.retryCompactionAt {
		return false // a compaction failed lately: a clone each fetch would cost more
	}
	return m.writes >= compactEvery || m.size > CompactBound(m.baseline)
}

// Compact replaces the mirror with a fresh clone (the branch at depth 1 and
// the report refs), so that the shallow file and the packs of many fetches
// do not grow without bound. The refs the mirror leaves out of its fetches
// (fetchAround) are left out of the clone too, without being fetched again.
//
// The new clone is made in dir.new and synced to disk; the old mirror
// stays in place until then, and is swapped out through dir.old. A
// compaction killed at any point leaves a usable mirror: OpenMirror
// removes dir.new, and puts dir.old back when dir is missing.
//
// After a failure, NeedsCompaction waits a few fetches (twice as many after
// each failure in a row, up to maxCompactionBackoff) before it asks again.
func (m *Mirror) Compact(ctx context.Context) error {
	if err := m.compact(ctx); err != nil {
		m.failedCompactions++
		m.retryCompactionAt = m.writes + min(maxCompactionBackoff, 5<<min(m.failedCompactions-1, 4))
		return err
	}
	m.failedCompactions, m.retryCompactionAt = 0, 0
	return nil
}

func (m *Mirror) compact(ctx context.Context) error {
	tmp := m.dir + ".new"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	fresh := &Mirror{dir: tmp, remote: m.remote, reportPrefix: m.reportPrefix, auth: m.auth, skipped: m.skipped}
	repo, err := fresh.initRepo(tmp)
	if err != nil {
		return err
	}
	fresh.repo = repo
	if _, err := fresh.Fetch(ctx); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	baseline := dirSize(tmp)
	if err := writeBaseline(tmp, baseline); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := syncTree(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	old := m.dir + ".old"
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := os.Rename(m.dir, old); err != nil {
		return err
	}
	if err := os.Rename(tmp, m.dir); err != nil {
		_ = os.Rename(old, m.dir)
		return err
	}
	if err := syncDir(filepath.Dir(m.dir)); err != nil {
		return err
	}
	os.RemoveAll(old)
	repo, err = git.PlainOpen(m.dir)
	if err != nil {
		return err
	}
	m.repo, m.writes, m.skipped = repo, 0, fresh.skipped
	m.baseline = baseline
	m.measure()
	return nil
}

// Prune compacts a mirror that only publishes (the publisher's, which
// never fetches): it deletes the objects no ref reaches (the reports
// published before the last), with no network. A prune killed half-way
// leaves only unreachable objects behind, for the next one.
func (m *Mirror) Prune() error {
	if err := m.repo.Prune(git.PruneOptions{Handler: m.repo.DeleteObject}); err != nil {
		return fmt.Errorf("prune %s: %w", m.dir, err)
	}
	m.measure()
	m.writes, m.walkedAt, m.baseline = 0, 0, m.size
	return writeBaseline(m.dir, m.baseline)
}

// syncTree flushes every file and directory under dir to disk.
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

// CommitFS is CommitFS for a commit of the mirror.
func (m *Mirror) CommitFS(c *object.Commit) (fs.FS, error) { return CommitFS(m.repo, c, "") }

// Repository returns the mirror's repository, for readers (keel status):
// what it holds passed the fetch limits.
func (m *Mirror) Repository() *git.Repository { return m.repo }

// Snapshot is Snapshot for a commit of the mirror.
func (m *Mirror) Snapshot(c *object.Commit, dir string) error { return Snapshot(m.repo, c, dir) }

// Snapshot writes into dir the files of commit c of repo that
// render.ReadFiles reads, so that the last good commit stays readable
// whatever later shallow fetches and compactions do.
func Snapshot(repo *git.Repository, c *object.Commit, dir string) error {
	fsys, err := CommitFS(repo, c, "")
	if err != nil {
		return err
	}
	files, err := render.ReadFiles(fsys)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", c.Hash, err)
	}
	return WriteSnapshot(dir, c.Hash.String(), files)
}

// WriteSnapshot replaces dir with files (as render.ReadFiles returned them:
// regular files only, never a link) and a .keel-commit naming commit.
// Files are 0600 and directories 0700; dir appears whole or not at all.
func WriteSnapshot(dir, commit string, files []render.File) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := writeFiles(tmp, files); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("snapshot %s: %w", commit, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".keel-commit"), []byte(commit+"\n"), 0o600); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	old := dir + ".old"
	os.RemoveAll(old)
	if _, err := os.Lstat(dir); err == nil {
		if err := os.Rename(dir, old); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	os.RemoveAll(old)
	return syncDir(filepath.Dir(dir))
}

// writeFiles writes files under a new directory dir, through an os.Root so
// that no path, however it reads, lands outside it.
func writeFiles(dir string, files []render.File) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, f := range files {
		if !fs.ValidPath(f.Path) {
			return fmt.Errorf("%q is not a path within the repository", f.Path)
		}
		if d := path.Dir(f.Path); d != "." {
			if err := root.MkdirAll(d, 0o700); err != nil {
				return err
			}
		}
		w, err := root.OpenFile(f.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = w.Write(f.Data)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// SnapshotCommit returns the commit a snapshot directory holds.
func SnapshotCommit(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, ".keel-commit"))
	if err != nil {
		return "", err
	}
	return string(bytes.TrimSpace(data)), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
