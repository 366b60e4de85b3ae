module slurmgate.local/pause

go 1.26
