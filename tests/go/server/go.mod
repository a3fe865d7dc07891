module server

go 1.22
