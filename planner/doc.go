// Package planner decides, from the rendered model, keel.lock, the nodes'
// reports and "now", which node runs which instance at which address, which
// endpoints each Service proxies to, which node serves each Ingress, and
// which instances a rollout may update. It also compares two plans (for
// keel plan) and a plan with what the reports show (what is pending).
//
// Every agent runs it on the same inputs and must reach byte-for-byte the
// same plan, so it is a pure function: it never reads the clock (now is an
// input), the disk or the network, and its result never depends on the
// order of its inputs. It must not import os/exec, net, or this module's
// sync and nodeexec packages (a test enforces this).
package planner
