// The sandbox ("pause") image of the local cluster's real Nodes (cluster/realnode.py): it
// cannot be pulled here, so we build our own. Static, no shell in the image.
//
//	/pause                 print one line, then sleep until SIGTERM/SIGINT (exit 0), reaping
//	                       children, as a Pod sandbox's PID 1 must
//	/pause -listen ADDR    the same, and answer HTTP on ADDR (the host reaching a Pod IP)
//	/pause -probe URL      GET URL once (TLS unverified), print "probe URL status N", exit 0
//	                       (a Pod on the bridge reaching the apiserver)
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const version = "1.0"

func probe(url string) {
	c := &http.Client{
		Timeout: 5 * time.Second,
		// the probe asks whether the address answers at all, not who signed it
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	resp, err := c.Get(url)
	if err != nil {
		fmt.Printf("probe %s error %v\n", url, err)
		return
	}
	resp.Body.Close()
	fmt.Printf("probe %s status %d\n", url, resp.StatusCode)
}

func main() {
	probeURL := flag.String("probe", "", "GET this URL once, print the status, exit")
	listen := flag.String("listen", "", "answer HTTP on this address while pausing")
	flag.Parse()
	if *probeURL != "" {
		probe(*probeURL)
		return
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	if *listen != "" {
		go func() {
			err := http.ListenAndServe(*listen, http.HandlerFunc(
				func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "slurmgate-pause") }))
			fmt.Fprintln(os.Stderr, "listen:", err)
		}()
	}
	fmt.Printf("slurmgate-pause %s started (pid %d)\n", version, os.Getpid())
	for s := range sigs {
		if s == syscall.SIGCHLD {
			// PID 1 of the sandbox inherits orphans: reap every exited one
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		fmt.Printf("slurmgate-pause: %v, exiting\n", s)
		os.Exit(0)
	}
}
