//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/localcluster"
	"github.com/keel-dev/keel/nodeexec/oci/ocitest"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// imageService is the web Service run from an OCI image whose
// etc/greeting the replicas answer with.
func imageService(image string) string {
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: 3
  port: %d
  strategy: {progressDeadline: 5s}
  template:
    image: %s
    command: [%q, demo-web, --port, "%d", --greeting-file, etc/greeting]
    resources: {cpu: 100m, memory: 64M}
`, webPort, image, demoBin, webPort)
}

// TestOCIImages: three agents run a Service from an OCI image served by
// a registry on 127.0.0.1; a push changing the digest rolls the new image
// out; a push of a digest the registry does not hold pauses the rollout
// on the first replica, the others serving the old image untouched; git
// revert recovers.
func TestOCIImages(t *testing.T) {
	t.Parallel()
	reg := ocitest.NewRegistry(t)
	build := func(greeting string) string {
		return ocitest.Spec(reg.Push(t, "team/web", ocitest.Image(t,
			ocitest.Layer(t, compression.GZip, ocitest.Dir("etc", 0o755), ocitest.File("etc/motd", "a base layer\n", 0o644)),
			ocitest.Layer(t, compression.ZStd, ocitest.File("etc/greeting", greeting+"\n", 0o644)))))
	}
	v1, v2 := build("image-v1"), build("image-v2")
	c := newCluster(t, 4*time.Minute, localcluster.Options{Files: map[string]string{"apps/web.yaml": imageService(v1)}})
	c.converge("first commit")
	c.checkAnswers("web", 3, "image-v1")

	c.commit("web: image v2", map[string]string{"apps/web.yaml": imageService(v2)})
	c.converge("image v2")
	c.checkAnswers("web", 3, "image-v2")

	ref, err := render.ParseImage(v2)
	if err != nil {
		t.Fatal(err)
	}
	ref.Digest = "sha256:" + strings.Repeat("d", 64)
	missing := render.OCIPrefix + ref.Name()
	c.commit("web: a digest the registry does not hold", map[string]string{"apps/web.yaml": imageService(missing)})
	newHash := c.model().Instance("web-0").SpecHash
	var waiting string
	c.waitFor("the rollout pauses on one replica whose pull fails", func() (bool, string) {
		sts, err := c.statuses()
		if err != nil {
			return false, err.Error()
		}
		var pulls []string
		for _, st := range sts {
			for _, ri := range st.Report.Instances {
				if ri.State != report.StateRunning {
					return false, fmt.Sprintf("%s is %s", ri.Name, ri.State)
				}
				if p := ri.Pull; p != nil {
					if p.SpecHash != newHash || p.Failures == 0 || !strings.Contains(p.Error, "MANIFEST_UNKNOWN") {
						return false, fmt.Sprintf("%s: pull %+v", ri.Name, *p)
					}
					pulls, waiting = append(pulls, ri.Name), ri.Name
				}
			}
		}
		if len(pulls) != 1 {
			return false, fmt.Sprintf("pulls reported for %v, want one replica", pulls)
		}
		for _, n := range c.Nodes {
			if v, err := c.metric(n, `keel_rollout_paused{service="web"}`); err != nil || v != 1 {
				return false, fmt.Sprintf("%s: keel_rollout_paused %v %v", n, v, err)
			}
		}
		return true, ""
	})
	// The others serve the old image, untouched, while the agents plan a
	// few more times.
	time.Sleep(3 * poll)
	sts := c.mustStatuses()
	for i := range 3 {
		name := fmt.Sprintf("web-%d", i)
		nodes := runningOn(sts)[name]
		if len(nodes) != 1 {
			t.Fatalf("%s runs on %v", name, nodes)
		}
		ri := reported(sts[nodes[0]], name)
		if ri.SpecHash == newHash || (name != waiting && ri.Pull != nil) {
			t.Errorf("%s moved on while the rollout is paused: %+v", name, ri)
		}
		if body, err := httpGet(c.ctx, ri.Address, webPort); err != nil || !strings.HasPrefix(body, "image-v2 from "+name) {
			t.Errorf("%s answers %q, %v while paused; want the old image's greeting", name, body, err)
		}
	}

	c.commit("Revert: web: a digest the registry does not hold", map[string]string{"apps/web.yaml": imageService(v2)})
	c.converge("git revert")
	c.checkAnswers("web", 3, "image-v2")
	for n, st := range c.mustStatuses() {
		for _, ri := range st.Report.Instances {
			if ri.Pull != nil {
				t.Errorf("%s still reports a pull for %s after the revert: %+v", n, ri.Name, *ri.Pull)
			}
		}
	}

	// keel image list and prune on a node: v1 is unused, v2 in use.
	dir := c.stateDirs(c.Nodes[0])[0]
	keel := func(out any, args ...string) {
		t.Helper()
		cmd := exec.Command(keelBin, append(args, "--state-dir", dir, "-o", "json")...)
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("keel %s: %v %s", strings.Join(args, " "), err, b)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("keel %s: %v: %s", strings.Join(args, " "), err, b)
		}
	}
	digest := func(image string) string { ref, _ := render.ParseImage(image); return ref.Digest }
	var images []agent.ImageInfo
	keel(&images, "image", "list")
	inUse := map[string]bool{}
	for _, img := range images {
		inUse[img.Digest] = img.InUse
	}
	if len(images) != 2 || !inUse[digest(v2)] || inUse[digest(v1)] {
		t.Fatalf("keel image list: %+v; want v1 unused and v2 in use", images)
	}
	var pruned agent.PruneResult
	keel(&pruned, "image", "prune")
	if len(pruned.Removed) != 1 || pruned.Removed[0].Digest != digest(v1) || pruned.Layers != 1 {
		t.Fatalf("keel image prune: %+v; want v1 and its own layer removed", pruned)
	}
	images = nil
	keel(&images, "image", "list")
	if len(images) != 1 || images[0].Digest != digest(v2) {
		t.Fatalf("keel image list after the prune: %+v", images)
	}
	c.checkAnswers("web", 3, "image-v2")
}
