module sites

go 1.22
