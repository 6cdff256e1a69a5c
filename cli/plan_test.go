package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/cli"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// planTime is the fixed "now" of the plan tests.
var planTime = time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)

// git runs git in dir with a clean, test-only configuration.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com",
		"GIT_AUTHOR_DATE=2026-11-29T12:00:00Z", "GIT_COMMITTER_DATE=2026-11-29T12:00:00Z")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// initRepo makes a git repository holding repo-example as its first commit.
func initRepo(t *testing.T) string {
	t.Helper()
	dir := copyRepo(t)
	git(t, dir, "init", "-q", "-b", "main")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "initial cluster")
	return dir
}

// editFile applies replacements to a file of the repository.
func editFile(t *testing.T, dir, file string, pairs ...string) {
	t.Helper()
	path := filepath.Join(dir, file)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("%s does not contain %q", file, pairs[i])
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeReports writes, for the repository at dir, the reports of a cluster
// that runs exactly the current plan; nodes in dead report 5 minutes late.
func writeReports(t *testing.T, dir string, dead ...string) string {
	t.Helper()
	m, err := render.Render(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	plan := planner.Compute(planner.Input{Model: m, Now: planTime, AssumeAlive: true})
	reports := map[string]*report.Report{}
	for _, n := range m.Nodes {
		r := &report.Report{Node: n.Name, Time: planTime.Add(-2 * time.Second), AgentVersion: "0.1.0", Commit: "0123456789abcdef", PlanID: plan.PlanID,
			Capacity: report.Capacity{CPU: 8000, Memory: 32 << 30}}
		for _, d := range dead {
			if d == n.Name {
				r.Time = planTime.Add(-5 * time.Minute)
			}
		}
		reports[n.Name] = r
	}
	for _, pl := range plan.Placements {
		inst := m.Instance(pl.Instance)
		r := reports[pl.Node]
		r.Instances = append(r.Instances, report.Instance{Name: pl.Instance, State: report.StateRunning, Address: pl.Address, SpecHash: inst.SpecHash})
		for _, v := range inst.Spec.Volumes {
			r.Volumes = append(r.Volumes, report.Volume{Name: v.Name})
		}
	}
	for _, in := range plan.Ingresses {
		if r := reports[in.Owner]; r != nil {
			r.Certificates = append(r.Certificates, report.Certificate{Host: in.Host, Expires: planTime.Add(60 * 24 * time.Hour)})
		}
	}
	out := t.TempDir()
	for name, r := range reports {
		if err := os.WriteFile(filepath.Join(out, "report-"+name+".yaml"), r.Marshal(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// racctOff makes node's report in the reports directory say that its
// host has resource accounting off, as the freebsd driver's checks report
// it.
func racctOff(t *testing.T, reports, node string) {
	t.Helper()
	path := filepath.Join(reports, "report-"+node+".yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := report.ParseFile(data)
	if err != nil {
		t.Fatal(err)
	}
	r.Problems = append(r.Problems, report.Problem{Check: report.CheckRacct,
		Problem: "resource accounting is off: instances with limits are refused", Fix: "echo kern.racct.enable=1 >> /boot/loader.conf, then reboot"})
	if err := os.WriteFile(path, r.Marshal(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestPlanScenariosGolden(t *testing.T) {
	scenarios := []struct {
		name string
		edit func(t *testing.T, dir string)
		dead []string
	}{
		{"scale-up", func(t *testing.T, dir string) {
			editFile(t, dir, "apps/web.yaml", "replicas: 3", "replicas: 5")
		}, nil},
		{"add-service", func(t *testing.T, dir string) {
			svc := "apiVersion: keel/v1\nkind: Service\nmetadata: {name: api}\nspec:\n  replicas: 2\n  port: 9000\n  template:\n    image: base/14.2-api\n    command: [/usr/local/bin/api]\n    resources: {cpu: 250m, memory: 128M}\n"
			if err := os.WriteFile(filepath.Join(dir, "apps/api.yaml"), []byte(svc), 0o644); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"image-replace", func(t *testing.T, dir string) {
			editFile(t, dir, "apps/web.yaml", "image: base/14.2-web", "image: base/14.3-web")
		}, nil},
		{"env-restart", func(t *testing.T, dir string) {
			editFile(t, dir, "apps/web.yaml", "LOG_LEVEL: info", "LOG_LEVEL: debug")
		}, nil},
		{"drain-node", func(t *testing.T, dir string) {
			editFile(t, dir, "nodes/fra1.yaml", "  capacity:", "  schedulable: false\n  capacity:")
		}, nil},
		{"node-dead", func(t *testing.T, dir string) {}, []string{"fra2"}},
		// Issue 9: fra2 reports resource accounting off, so it cannot
		// enforce limits: what it runs moves off it, and the plan says why.
		{"racct-off", func(t *testing.T, dir string) {}, nil},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			dir := initRepo(t)
			reports := writeReports(t, dir, sc.dead...)
			if sc.name == "racct-off" {
				racctOff(t, reports, "fra2")
			}
			sc.edit(t, dir)
			git(t, dir, "commit", "-q", "-a", "--allow-empty", "-m", sc.name)
			git(t, dir, "add", "-A")
			git(t, dir, "commit", "-q", "--amend", "--no-edit", "--allow-empty")
			for _, f := range []struct{ format, ext string }{{"text", "txt"}, {"markdown", "md"}} {
				code, out, errOut := keel(t, "plan", "--repo", dir, "--base", "main~1", "--head", "main",
					"--reports", reports, "--now", planTime.Format(time.RFC3339), "-o", f.format)
				if code != cli.ExitOK {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				golden(t, "plan/"+sc.name+"."+f.ext, stripCommits(out))
			}
		})
	}
}

var planIDs = regexp.MustCompile("(plan:? `?)[0-9a-f]{10,32}")

// stripCommits hides the commit hashes and the plan ID (which hashes the
// commit), since they change with any byte of the example repository.
func stripCommits(s string) string {
	s = planIDs.ReplaceAllString(s, "${1}<plan>")
	for _, key := range []string{"main~1 (", "main ("} {
		for i := strings.Index(s, key); i >= 0; {
			start := i + len(key)
			end := strings.IndexByte(s[start:], ')')
			s = s[:start] + "<sha>" + s[start+end:]
			next := strings.Index(s[start:], key)
			if next < 0 {
				break
			}
			i = start + next
		}
	}
	return s
}

func TestPlanJSONSchema(t *testing.T) {
	dir := initRepo(t)
	reports := writeReports(t, dir, "fra2")
	code, out, errOut := keel(t, "plan", "--repo", dir, "--base", "main", "--reports", reports, "--now", planTime.Format(time.RFC3339), "-o", "json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"nodes", "placements", "unschedulable", "services", "changes", "pending", "warnings", "errors", "planID"} {
		if _, ok := doc[key]; !ok {
			t.Errorf("JSON output lacks %q", key)
		}
	}
	var typed struct {
		Nodes []struct {
			Name, PodCIDR, Address string
			Alive                  bool
		}
		Placements    []struct{ Instance, Service, Node, Address string }
		Unschedulable []struct{ Instance, Reason string }
		Pending       []struct{ Instance, Action, Node, From, Reason string }
	}
	if err := json.Unmarshal([]byte(out), &typed); err != nil {
		t.Fatal(err)
	}
	if len(typed.Nodes) != 3 || len(typed.Placements)+len(typed.Unschedulable) != 7 {
		t.Fatalf("want 3 nodes and 7 instances placed or unschedulable, got %d, %d and %d", len(typed.Nodes), len(typed.Placements), len(typed.Unschedulable))
	}
	for _, n := range typed.Nodes {
		if n.Alive == (n.Name == "fra2") {
			t.Errorf("node %s alive=%v", n.Name, n.Alive)
		}
	}
	moved := 0
	for _, p := range typed.Pending {
		if p.Action == "move" && p.From == "fra2" {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("no pending move off the dead fra2: %+v", typed.Pending)
	}
}

func TestPlanPlacesEveryInstanceOfTheExample(t *testing.T) {
	dir := initRepo(t)
	reports := writeReports(t, dir)
	code, out, errOut := keel(t, "plan", "--repo", dir, "--reports", reports, "--now", planTime.Format(time.RFC3339), "-o", "json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Placements    []struct{ Instance, Node string }
		Unschedulable []any
		Pending       []any
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Placements) != 7 || len(doc.Unschedulable) != 0 || len(doc.Pending) != 0 {
		t.Fatalf("placements %d, unschedulable %d, pending %d: %s", len(doc.Placements), len(doc.Unschedulable), len(doc.Pending), out)
	}
}

func TestPlanInvalidHeadExits1(t *testing.T) {
	dir := initRepo(t)
	editFile(t, dir, "apps/web.yaml", "replicas: 3", "replicas: three")
	git(t, dir, "commit", "-q", "-a", "-m", "typo")
	for _, format := range []string{"text", "markdown", "json"} {
		code, out, _ := keel(t, "plan", "--repo", dir, "--base", "main~1", "--head", "main", "-o", format)
		if code != cli.ExitInvalid || !strings.Contains(out, "apps/web.yaml:8:13: spec.replicas") {
			t.Errorf("%s: exit %d\n%s", format, code, out)
		}
	}
}

// TestPlanReadsReportRefs publishes reports the way agents do, on
// refs/keel/reports/<node> of a bare "server" repository, and checks that
// keel plan reads them after --reports-remote fetches them into a clone.
func TestPlanReadsReportRefs(t *testing.T) {
	src := initRepo(t)
	reportsDir := writeReports(t, src, "fra3")
	server := filepath.Join(t.TempDir(), "cluster.git")
	git(t, src, "clone", "-q", "--bare", src, server)
	for _, node := range []string{"fra1", "fra2", "fra3"} {
		blob := git(t, server, "hash-object", "-w", filepath.Join(reportsDir, "report-"+node+".yaml"))
		tree := strings.TrimSpace(pipeGit(t, server, "100644 blob "+blob+"\treport.yaml\n", "mktree"))
		commit := git(t, server, "commit-tree", tree, "-m", "report of "+node)
		git(t, server, "update-ref", "refs/keel/reports/"+node, commit)
	}
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, src, "clone", "-q", server, clone)

	code, out, errOut := keel(t, "plan", "--repo", clone, "--now", planTime.Format(time.RFC3339), "-o", "json")
	if code != cli.ExitOK || !strings.Contains(out, `"assumedAlive": true`) {
		t.Fatalf("a fresh clone has no report refs, so keel plan must assume all alive: exit %d %s\n%s", code, errOut, out)
	}
	code, out, errOut = keel(t, "plan", "--repo", clone, "--reports-remote", "origin", "--now", planTime.Format(time.RFC3339), "-o", "json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Reports      int
		AssumedAlive bool
		Nodes        []struct {
			Name  string
			Alive bool
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Reports != 3 || doc.AssumedAlive {
		t.Fatalf("reports %d, assumedAlive %v", doc.Reports, doc.AssumedAlive)
	}
	for _, n := range doc.Nodes {
		if n.Alive != (n.Name != "fra3") {
			t.Errorf("%s alive=%v (fra3 reported 5 minutes late)", n.Name, n.Alive)
		}
	}
	// Once fetched, the refs stay: a plain keel plan reads them too.
	if code, out, _ := keel(t, "plan", "--repo", clone, "--now", planTime.Format(time.RFC3339), "-o", "json"); code != cli.ExitOK || !strings.Contains(out, `"reports": 3`) {
		t.Errorf("fetched report refs not read: %s", out)
	}
}

func pipeGit(t *testing.T, dir, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return string(out)
}

// TestPlanInvalidBaseValidHead: a change that fixes a broken base is
// planned on its own, with a warning, and does not fail.
func TestPlanInvalidBaseValidHead(t *testing.T) {
	dir := initRepo(t)
	editFile(t, dir, "apps/web.yaml", "replicas: 3", "replicas: three")
	git(t, dir, "commit", "-q", "-a", "-m", "break")
	editFile(t, dir, "apps/web.yaml", "replicas: three", "replicas: 4")
	git(t, dir, "commit", "-q", "-a", "-m", "fix")
	code, out, errOut := keel(t, "plan", "--repo", dir, "--base", "main~1", "--head", "main", "-o", "json")
	if code != cli.ExitOK || !strings.Contains(out, `"code": "invalid-base"`) || !strings.Contains(out, `"compared": false`) {
		t.Fatalf("exit %d %s\n%s", code, errOut, out)
	}
}

// TestPlanShowsANodeRemovedFromTheInventory (issue 8 item 11): after
// nodes/fra2.yaml is deleted (with the exporter Jail that only ran there,
// and db-0's pin), fra2's report still lists what it runs. keel plan must
// not say "no changes": fra2's agent stops all of it (it decommissions
// itself), so the pending work lists the stop of the exporter, the moves
// off fra2 name the inventory (not a dead node), and a node-leaving
// warning says what is going on; in every output format.
func TestPlanShowsANodeRemovedFromTheInventory(t *testing.T) {
	dir := initRepo(t)
	reports := writeReports(t, dir)
	if err := os.Remove(filepath.Join(dir, "nodes/fra2.yaml")); err != nil {
		t.Fatal(err)
	}
	tools, err := os.ReadFile(filepath.Join(dir, "jails/tools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bastion, _, ok := strings.Cut(string(tools), "\n---\n")
	if !ok {
		t.Fatal("jails/tools.yaml has no second document")
	}
	if err := os.WriteFile(filepath.Join(dir, "jails/tools.yaml"), []byte(bastion+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	editFile(t, dir, "keel.lock", "  db-0: fra2\n", "")
	args := []string{"plan", "--repo", dir, "--reports", reports, "--now", planTime.Format(time.RFC3339)}

	code, out, errOut := keel(t, append(args, "-o", "json")...)
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	var doc struct {
		Pending  []planner.Change
		Warnings []planner.Warning
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	stops, moves := map[string]string{}, map[string]string{}
	for _, c := range doc.Pending {
		switch c.Action {
		case planner.ActionStop:
			stops[c.Instance] = c.Node
		case planner.ActionMove:
			if c.From == "fra2" {
				moves[c.Instance] = c.Reason
			}
		}
	}
	if stops["exporter"] != "fra2" || len(stops) != 1 {
		t.Errorf("pending stops %v, want exporter on fra2 (the rest of fra2's work moves): %+v", stops, doc.Pending)
	}
	if len(moves) != 2 || !strings.Contains(moves["web-0"], "not in the inventory") || !strings.Contains(moves["db-0"], "once fra2 reports it stopped") {
		t.Errorf("moves off fra2 %v, want web-0 and db-0 saying fra2 left the inventory", moves)
	}
	leaving := false
	for _, w := range doc.Warnings {
		leaving = leaving || w.Code == planner.WarnNodeLeaving && w.Subject == "fra2" && strings.Contains(w.Message, "3 instances not stopped")
	}
	if !leaving {
		t.Errorf("no node-leaving warning for fra2: %+v", doc.Warnings)
	}

	code, out, _ = keel(t, append(args, "-o", "text")...)
	if code != cli.ExitOK || !strings.Contains(out, "pending: 1 to stop (nodes leaving), 2 to move;") ||
		!regexp.MustCompile(`(?m)^  stop +exporter +fra2 +node fra2 is not in the inventory: its agent stops it \(decommission\)$`).MatchString(out) {
		t.Errorf("text output:\n%s", out)
	}
	code, out, _ = keel(t, append(args, "-o", "markdown")...)
	if code != cli.ExitOK || !strings.Contains(out, "| stop | `exporter` | fra2 | node fra2 is not in the inventory") {
		t.Errorf("markdown output:\n%s", out)
	}
}
