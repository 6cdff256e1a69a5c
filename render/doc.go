// Package render reads a cluster repository (from any fs.FS: a directory or a
// git tree at a commit) into a validated, expanded model: the Cluster
// settings, the node inventory with its subnets, the Services with their VIPs,
// every instance with its resolved spec and specHash, and the Ingresses.
//
// Every problem is reported at once, each with its position
// (file:line:col: field.path: message). Render is pure: it reads only the
// fs.FS it is given, never the clock, the network or the OS, and it must not
// import os/exec, net, or this module's sync and nodeexec packages (a test
// enforces this).
package render
