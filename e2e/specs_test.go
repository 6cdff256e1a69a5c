//go:build linux

package e2e

import (
	"fmt"
	"strings"

	"github.com/keel-dev/keel/nodeexec/process"
)

// The workloads all run keel's own demo-web, which answers HTTP on
// $KEEL_ADDRESS:port with its greeting, instance and node; with --data it
// keeps a request count in that directory (a volume).

const webPort = 8080

// webService is a stateless Service of demo-web replicas.
func webService(replicas int, image, greeting string) string {
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Service
metadata:
  name: web
spec:
  replicas: %d
  port: %d
  template:
    image: %s
    command: [%q, demo-web, --port, "%d"]
    env:
      GREETING: %s
    resources: {cpu: 100m, memory: 64M}
`, replicas, webPort, image, demoBin, webPort, greeting)
}

// dbService is a stateful Service: each replica has a volume, pinned by
// keel.lock.
func dbService(replicas int) string {
	return fmt.Sprintf(`apiVersion: keel/v1
kind: Service
metadata:
  name: db
spec:
  replicas: %d
  port: 5432
  template:
    image: base/demo
    command: [%q, demo-web, --port, "5432", --data, "${KEEL_VOLUME_DATA}"]
    resources: {cpu: 100m, memory: 64M}
    volumes:
      - name: data
        mountPath: /var/db
`, replicas, demoBin)
}

// jail is a Jail of demo-web on node (any node when empty), with a volume
// when stateful.
func jail(name, node string, port int, stateful bool) string {
	s := fmt.Sprintf(`apiVersion: keel/v1
kind: Jail
metadata:
  name: %s
spec:
  image: base/demo
`, name)
	if node != "" {
		s += "  node: " + node + "\n"
	}
	if stateful {
		s += fmt.Sprintf(`  command: [%q, demo-web, --port, "%d", --data, "${%s}"]
  volumes:
    - name: %s
      mountPath: /var/db
`, demoBin, port, volumeVar(name+"-data"), name+"-data")
	} else {
		s += fmt.Sprintf("  command: [%q, demo-web, --port, \"%d\"]\n", demoBin, port)
	}
	return s + "  resources: {cpu: 50m, memory: 32M}\n"
}

// volumeVar is the variable that holds a Jail's volume's host path.
func volumeVar(volume string) string {
	return "KEEL_VOLUME_" + strings.ToUpper(strings.ReplaceAll(volume, "-", "_"))
}

func processDriver(stateDir string) (*process.Driver, error) {
	return process.New(process.Options{StateDir: stateDir})
}
