package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/render"
)

// socketFlags locate the agent's local API.
func socketFlags(cmd *cobra.Command) (socket, stateDir *string) {
	socket = cmd.Flags().String("socket", "", "the agent's local API socket (default <state-dir>/keel.sock)")
	stateDir = cmd.Flags().String("state-dir", "/var/db/keel", "the agent's state directory")
	return socket, stateDir
}

// apiClient talks HTTP to the agent over its Unix socket.
func apiClient(socket, stateDir string) (*http.Client, string) {
	if socket == "" {
		socket = filepath.Join(stateDir, "keel.sock")
	}
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}, socket
}

// callAPI sends a request to the agent and decodes its JSON answer into out.
func callAPI(ctx context.Context, socket, stateDir, method, path string, out any) error {
	c, sock := apiClient(socket, stateDir)
	req, err := http.NewRequestWithContext(ctx, method, "http://keel"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the agent on %s (is keel agent running, and are you its user?): %w", sock, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return &exitError{code: ExitInvalid, err: errors.New(e.Error)}
		}
		return fmt.Errorf("agent answered %s", resp.Status)
	}
	return json.Unmarshal(body, out)
}

func (e *env) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Ask this node's agent about its state"}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show this node's report: instances, volumes, the commit applied or refused",
		Args:  cobra.NoArgs,
	}
	socket, stateDir := socketFlags(status)
	format := formatFlag(status, "text", "yaml", "json")
	status.RunE = func(cmd *cobra.Command, _ []string) error {
		var st agent.Status
		if err := callAPI(e.ctx, *socket, *stateDir, "GET", "/v1/status", &st); err != nil {
			return err
		}
		switch *format {
		case "json":
			return writeJSON(e.stdout, st)
		case "yaml":
			_, err := e.stdout.Write(st.Report.Marshal())
			return err
		}
		r := st.Report
		fmt.Fprintf(e.stdout, "node %s  agent %s  applied %s", r.Node, r.AgentVersion, shortSHA(st.Applied))
		if st.Newest != "" && st.Newest != st.Applied {
			fmt.Fprintf(e.stdout, "  newest %s", shortSHA(st.Newest))
		}
		fmt.Fprintf(e.stdout, "  plan %s\n", shortSHA(r.PlanID))
		if r.Refused != nil {
			fmt.Fprintf(e.stdout, "REFUSED %s: %s\n", shortSHA(r.Refused.Commit), r.Refused.Reason)
		}
		if !st.GitOK && st.GitError != "" {
			fmt.Fprintf(e.stdout, "git unreachable (running the last plan): %s\n", st.GitError)
		}
		if st.Suspended {
			fmt.Fprintln(e.stdout, "cluster suspended: nothing is changed")
		}
		for _, p := range r.Problems {
			fmt.Fprintf(e.stdout, "HOST PROBLEM %s: %s; fix: %s\n", p.Check, p.Problem, p.Fix)
		}
		if st.Operations > 0 {
			fmt.Fprintf(e.stdout, "%d instance operations in flight\n", st.Operations)
		}
		fmt.Fprintf(e.stdout, "\n%-24s %-10s %-16s %-8s %s\n", "INSTANCE", "STATE", "ADDRESS", "RESTARTS", "ERROR")
		for _, in := range r.Instances {
			fmt.Fprintf(e.stdout, "%-24s %-10s %-16s %-8d %s\n", in.Name, in.State, addrString(in.Address.String()), in.Restarts, in.Error)
			if p := in.Pull; p != nil {
				line := "pulling " + p.Image
				if p.Error != "" {
					line += fmt.Sprintf(": %s (%d failures)", p.Error, p.Failures)
				}
				fmt.Fprintf(e.stdout, "%-24s %s\n", "", line)
			}
		}
		if len(r.Volumes) > 0 {
			names := make([]string, len(r.Volumes))
			for i, v := range r.Volumes {
				names[i] = v.Name
			}
			fmt.Fprintf(e.stdout, "\nvolumes: %s\n", strings.Join(names, ", "))
		}
		return nil
	}
	cmd.AddCommand(status)
	return cmd
}

func (e *env) volumeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "List or delete this node's volumes"}
	list := &cobra.Command{Use: "list", Short: "List the volumes on this node and what mounts them", Args: cobra.NoArgs}
	socket, stateDir := socketFlags(list)
	format := formatFlag(list, "text", "json")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		var vols []agent.VolumeInfo
		if err := callAPI(e.ctx, *socket, *stateDir, "GET", "/v1/volumes", &vols); err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(e.stdout, vols)
		}
		fmt.Fprintf(e.stdout, "%-32s %s\n", "VOLUME", "MOUNTED BY")
		for _, v := range vols {
			fmt.Fprintf(e.stdout, "%-32s %s\n", v.Name, v.MountedBy)
		}
		return nil
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Destroy a volume and its data for good (refused while an instance mounts it)",
		Long: `Delete destroys a volume on this node, with its data, for good. It is
refused while an instance mounts it. Volumes outlive instances: this is the
only way one is ever destroyed. It asks for confirmation unless --yes.`,
		Args: cobra.ExactArgs(1),
	}
	dsocket, dstateDir := socketFlags(del)
	yes := del.Flags().Bool("yes", false, "do not ask for confirmation")
	del.RunE = func(cmd *cobra.Command, args []string) error {
		name := args[0]
		if err := render.CheckName(name); err != nil {
			return fmt.Errorf("volume name: %w", err)
		}
		if !*yes {
			if f, ok := e.stdin.(*os.File); !ok || !isTerminal(f) {
				return errors.New("refusing to destroy data without confirmation: pass --yes")
			}
			fmt.Fprintf(e.stderr, "Destroy volume %s and all its data for good? Type its name to confirm: ", name)
			var answer string
			_, _ = fmt.Fscanln(e.stdin, &answer)
			if answer != name {
				return &exitError{code: ExitInvalid, err: errors.New("not confirmed; nothing deleted")}
			}
		}
		var out map[string]string
		if err := callAPI(e.ctx, *dsocket, *dstateDir, "DELETE", "/v1/volumes/"+name, &out); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "deleted volume %s\n", name)
		return nil
	}
	cmd.AddCommand(list, del)
	return cmd
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

func (e *env) imageCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "List or prune this node's OCI images"}
	list := &cobra.Command{Use: "list", Short: "List the OCI images unpacked on this node and whether an instance uses them", Args: cobra.NoArgs}
	socket, stateDir := socketFlags(list)
	format := formatFlag(list, "text", "json")
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		var images []agent.ImageInfo
		if err := callAPI(e.ctx, *socket, *stateDir, "GET", "/v1/images", &images); err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(e.stdout, images)
		}
		fmt.Fprintf(e.stdout, "%-71s %-6s %12s %12s %s\n", "DIGEST", "IN USE", "UNPACKED", "LAYERS", "ADDED")
		for _, img := range images {
			inUse := "no"
			if img.InUse {
				inUse = "yes"
			}
			fmt.Fprintf(e.stdout, "%-71s %-6s %12d %12d %s\n", img.Digest, inUse, img.Unpacked, img.Size, img.Added.UTC().Format(time.RFC3339))
		}
		return nil
	}
	prune := &cobra.Command{
		Use:   "prune",
		Short: "Remove the OCI images and artifacts no instance of this node uses or needs, and their cached layers",
		Long: `Prune removes, at once, the OCI images unpacked on this node that no
instance runs from or needs (running, starting, pulling or held back by a
rollout), added more than --grace ago, then the cached files (layers and
artifacts) downloaded more than --grace ago that no image left and no
such instance uses. The agent also does this on its own when the images pass
--image-cache-max or the disk has less than --image-min-free free
(docs/images.md). An image or artifact pruned that is needed again is
pulled again.`,
		Args: cobra.NoArgs,
	}
	psocket, pstateDir := socketFlags(prune)
	grace := prune.Flags().Duration("grace", 0, "keep the images added, and the files downloaded, less than this long ago")
	pformat := formatFlag(prune, "text", "json")
	prune.RunE = func(cmd *cobra.Command, _ []string) error {
		if *grace < 0 {
			return errors.New("--grace must not be negative")
		}
		var res agent.PruneResult
		if err := callAPI(e.ctx, *psocket, *pstateDir, "POST", "/v1/images/prune?grace="+grace.String(), &res); err != nil {
			return err
		}
		if *pformat == "json" {
			return writeJSON(e.stdout, res)
		}
		for _, img := range res.Removed {
			fmt.Fprintf(e.stdout, "removed %s (%d bytes)\n", img.Digest, img.Unpacked)
		}
		fmt.Fprintf(e.stdout, "%d images and %d cached layers or artifacts removed, %d bytes freed\n", len(res.Removed), res.Layers, res.Freed)
		return nil
	}
	cmd.AddCommand(list, prune)
	return cmd
}
