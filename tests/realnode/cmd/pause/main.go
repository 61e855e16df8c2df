// Command pause is the sandbox image's only process: it waits until told to stop, as the
// upstream pause container does, and reaps nothing (each pod's containers have their own
// init). Built static, so the image is this one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
